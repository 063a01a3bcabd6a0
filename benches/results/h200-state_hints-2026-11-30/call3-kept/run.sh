#!/bin/bash
# Call 3: this build (the recurrent and conv states' loads and stores streaming) — the GPU suite
# but the tensor-parallel test; its decode steps against HEAD's and against a variant with the
# small-batch GEMVs' W loads streaming too, alternating, two rounds; the served 1.39B
# (vocabulary 4,096) at 1, 16 and 64 streams against its bare step.
mkdir -p /tmp/n /tmp/b /tmp/w && tar -C /tmp/n -xJf .devbuild/t.tar.xz && tar -C /tmp/b -xJf .devbuild/base.tar.xz && tar -C /tmp/w -xJf .devbuild/ws.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run3.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T="gpu_batch_invariant_mode_decode_step_rows_do_not_depend_on_the_batch gpu_batch_invariant_mode_logits_do_not_depend_on_the_batch gpu_chunk_boundaries_match_cpu gpu_conv_and_swiglu_match_cpu gpu_conv_folded_into_projection_equals_two_kernels gpu_decode_graphs_equal_eager_decode gpu_decode_in_any_slot_order_equals_each_alone gpu_gated_norm_folded_into_gemv_equals_two_kernels gpu_gemm_matches_cpu gpu_host_tier_round_trips_snapshots_exactly gpu_mixed_graphs_equal_eager_mixed_passes gpu_mixed_passes_equal_separate_passes gpu_models_match_cpu_and_goldens gpu_norm_folded_into_gemv_equals_two_kernels gpu_ops_match_reference gpu_packed_model_prefill_equals_each_alone gpu_packed_prefill_equals_prefilling_each_alone gpu_paged_attention_matches_cpu gpu_prefill_graphs_equal_eager_prefill gpu_prefix_cache_snapshots_match_whole_prefills gpu_prep_and_gated_norm_match_cpu gpu_pruning_calibration_matches_the_cpu gpu_raw_decode_step_equals_prepare_then_step gpu_sampling_follows_the_distribution gpu_sampling_matches_cpu gpu_small_batch_linear_matches_cpu gpu_sparse_moe_matches_cpu gpu_warm_up_leaves_the_pool_as_it_was"
DELTASERVE_TESTS_DIR=$PWD/tests timeout 220 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "test result|FAIL|panicked" $L/tests.log | tail -5
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
ROUNDS=2 TIMEOUT=100 bash benches/ab_decode.sh $L/ab head=/tmp/b/gpu_bench new=/tmp/n/gpu_bench wstream=/tmp/w/gpu_bench > $L/ab.out 2>&1
cat $L/ab/summary.md
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
mkdir -p models/gdn-demo
[ -f $V/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 120 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 1,16,64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s: %s tok/s ", $2, $5}')"
MODEL=$V timeout 200 bash benches/serving_sweep.sh /tmp/n/deltaserve /tmp/n/serve_bench $L/sweep 1 16 64 > $L/sweep.log 2>&1
echo "sweep rc=$?"; cat $L/sweep/table.md
rm -f $L/sweep/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
