//! Unit tests of config parsing: fla's defaults, size rules and refusals.
use super::*;

fn parse(extra: &str) -> Result<ModelConfig, ConfigError> {
    ModelConfig::from_json_str(&format!(r#"{{"model_type":"gated_deltanet"{extra}}}"#))
}

#[test]
fn defaults_follow_fla_0_6_0() {
    let c = parse("").unwrap();
    assert_eq!((c.common.hidden_size, c.head_k_dim(), c.num_heads(), c.num_v_heads()), (2048, 256, 6, 6));
    assert_eq!(c.head_v_dim(), 512);
    assert_eq!(c.intermediate_size(), 5632);
    assert_eq!(c.eos_token_ids(), vec![2]);
    assert!(c.use_output_gate() && !c.common.allow_neg_eigval);
}

#[test]
fn mlp_rule_matches_spec_examples() {
    assert_eq!(parse(r#","hidden_size":1024"#).unwrap().intermediate_size(), 2816);
}

#[test]
fn gdp_defaults_differ_from_layer_defaults() {
    let c = ModelConfig::from_json_str(r#"{"model_type":"gated_deltaproduct"}"#).unwrap();
    assert_eq!(c.num_householder(), 1);
    assert!(!c.use_forget_gate());
    assert!(c.use_output_gate());
}

#[test]
fn delta_net_sizes_follow_expand_k_and_expand_v() {
    let c = ModelConfig::from_json_str(r#"{"model_type":"delta_net"}"#).unwrap();
    assert_eq!((c.num_heads(), c.head_k_dim(), c.head_v_dim(), c.common.num_hidden_layers), (16, 128, 128, 24));
    assert!(!c.use_forget_gate() && !c.use_output_gate());
    let c = ModelConfig::from_json_str(r#"{"model_type":"delta_net","hidden_size":64,"num_heads":2,"expand_k":0.5,"expand_v":2}"#).unwrap();
    assert_eq!((c.head_k_dim(), c.head_v_dim(), c.key_dim(), c.value_dim()), (16, 64, 32, 128));
    let e = ModelConfig::from_json_str(r#"{"model_type":"delta_net","hidden_size":64,"num_heads":3}"#).unwrap_err().to_string();
    assert!(e.contains("`expand_k`") && e.contains("num_heads (3)"), "{e}");
    let e = ModelConfig::from_json_str(r#"{"model_type":"delta_net","qk_norm":"l1"}"#).unwrap_err().to_string();
    assert!(e.contains("`qk_norm`") && e.contains("l1"), "{e}");
}

#[test]
fn refusals_name_field_and_value() {
    let e = parse(r#","num_hidden_layers":2,"attn":{"layers":[2],"num_heads":4}"#).unwrap_err().to_string();
    assert!(e.contains("`attn.layers`") && e.contains('2'), "{e}");
    let e = parse(r#","hidden_act":"powlu""#).unwrap_err().to_string();
    assert!(e.contains("`hidden_act`") && e.contains("powlu"), "{e}");
    let e = parse(r#","attnres_block_size":4"#).unwrap_err().to_string();
    assert!(e.contains("`attnres_block_size`") && e.contains('4'), "{e}");
    let e = ModelConfig::from_json_str(r#"{"model_type":"mamba2"}"#).unwrap_err().to_string();
    assert!(e.contains("`model_type`") && e.contains("mamba2"), "{e}");
    let e = parse(r#","num_heads":4,"num_v_heads":6"#).unwrap_err().to_string();
    assert!(e.contains("`num_v_heads`") && e.contains('6'), "{e}");
    let e = parse(r#","head_dim":3,"expand_v":0.5"#).unwrap_err().to_string();
    assert!(e.contains("`expand_v`"), "{e}");
}
