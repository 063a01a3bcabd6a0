//! The engine thread's step loop on the CPU: prompts beside running streams, the step budget
//! and long prompts' cap, steps launched ahead, and the channels' limits.

use super::*;

fn params() -> GenParams {
    GenParams::new(4)
}

/// A scheduler over the compact Gated DeltaNet fixture on the CPU, without the cache.
fn cpu_scheduler(prefill_budget: usize, mixed_batches: bool, decode_ahead: bool) -> Scheduler {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/compact/gdn");
    let engine = Engine::load(&deltaserve_engine::LoadOptions::cpu(dir)).unwrap();
    let cfg = SchedulerConfig {
        max_num_seqs: 4,
        kv_blocks: 0,
        max_queue: 4,
        max_model_len: 512,
        prefix_cache: PrefixCacheConfig::default(),
        prefill_budget,
        long_prefill_chunk: prefill_budget,
        mixed_batches,
        decode_ahead,
        request_timeout: std::time::Duration::from_secs(600),
        warmup: false,
        stop_warm_up: Default::default(),
    };
    Scheduler::new(engine, cfg, Arc::new(Metrics::new("gdn").unwrap()), Arc::new(Shared::default())).unwrap()
}

/// Tokens each receiver has seen so far.
fn tokens(rx: &mut mpsc::Receiver<Event>) -> usize {
    std::iter::from_fn(|| rx.try_recv().ok()).filter(|e| matches!(e, Event::Token { .. })).count()
}

#[test]
fn a_request_arriving_during_a_prefill_pass_starts_before_the_next_decode_step() {
    let long = GenParams { max_tokens: 8, ignore_eos: true, ..params() };
    for mixed in [false, true] {
        for (budget, b_starts) in [(256, true), (99, false)] {
            let case = format!("budget {budget}, mixed batches {mixed}");
            let mut s = cpu_scheduler(budget, mixed, false);
            let (tx, mut rx) = mpsc::channel(4);
            let (a, mut ea) = GenRequest::new("a".into(), (1..100).collect(), long.clone());
            s.enqueue(a);
            // b is in the channel when the step starts, so the engine thread takes it after
            // a's prefill pass, as it would one sent while that pass ran.
            let (b, mut eb) = GenRequest::new("b".into(), (1..20).collect(), long.clone());
            tx.try_send(Msg::Request(Box::new(b))).ok().unwrap();
            assert!(s.step(&mut rx).is_ok());
            // a: its prompt's token and a decode step's (in b's pass, when mixed). b: its
            // prompt's token (and a decode step's, unmixed) when a's 99 tokens left budget
            // for its 19; else nothing yet.
            assert_eq!(tokens(&mut ea), 2, "{case}: a");
            let b_first = match (b_starts, mixed) {
                (false, _) => 0,
                (true, true) => 1,
                (true, false) => 2,
            };
            assert_eq!(tokens(&mut eb), b_first, "{case}: b");
            // The next turn of the loop takes b in before its step in any case.
            assert!(s.receive(&mut rx).is_ok() && s.step(&mut rx).is_ok());
            assert_eq!(tokens(&mut eb), if b_starts || mixed { 1 } else { 2 }, "{case}: b, a step later");
            // Beside running streams the same holds within the budget: c (29 tokens,
            // waiting) and d (29, arriving during c's pass) both fit what a and b leave of
            // it. Mixed, c's second token comes in d's pass, which is the step's decode.
            let (c, mut ec) = GenRequest::new("c".into(), (1..30).collect(), long.clone());
            s.enqueue(c);
            let (d, mut ed) = GenRequest::new("d".into(), (1..30).collect(), long.clone());
            tx.try_send(Msg::Request(Box::new(d))).ok().unwrap();
            assert!(s.step(&mut rx).is_ok());
            assert_eq!((tokens(&mut ec), tokens(&mut ed)), if mixed { (2, 1) } else { (2, 2) }, "{case}: c and d beside streams");
            assert_eq!(tokens(&mut ea), if mixed { 3 } else { 2 }, "{case}: a, two steps later");
        }
    }
}

#[test]
fn long_prompts_advance_by_their_chunk_only_while_streams_outnumber_them() {
    let p = GenParams { max_tokens: 40, ignore_eos: true, ..params() };
    let prefilled = |s: &Scheduler, id: &str| s.requests.iter().find(|r| r.id == id).map(|r| r.prefilled);
    let (_tx, mut rx) = mpsc::channel(4);
    // Nothing decodes: a long prompt (300 > 128 tokens) takes the whole budget a step.
    let mut s = cpu_scheduler(128, true, false);
    s.cfg.long_prefill_chunk = 64;
    let (a, _ea) = GenRequest::new("a".into(), (1..301).collect(), p.clone());
    s.enqueue(a);
    for step in 1..=2 {
        assert!(s.step(&mut rx).is_ok());
        assert_eq!(prefilled(&s, "a"), Some(128 * step), "a alone, step {step}");
    }
    // b and c decode: a long prompt advances by 64 a step, and a short one (50 tokens) that
    // arrived with it takes the rest of the budget in the same step.
    let mut s = cpu_scheduler(128, true, false);
    s.cfg.long_prefill_chunk = 64;
    let (b, mut eb) = GenRequest::new("b".into(), (1..21).collect(), p.clone());
    let (c, _ec) = GenRequest::new("c".into(), (1..31).collect(), p.clone());
    s.enqueue(b);
    s.enqueue(c);
    assert!(s.step(&mut rx).is_ok());
    assert_eq!(tokens(&mut eb), 2, "b: its prompt's token and a decode step's");
    let (a, _ea) = GenRequest::new("a".into(), (1..301).collect(), p.clone());
    let (d, mut ed) = GenRequest::new("d".into(), (1..51).collect(), p.clone());
    s.enqueue(a);
    s.enqueue(d);
    for step in 1..=3 {
        assert!(s.step(&mut rx).is_ok());
        assert_eq!(prefilled(&s, "a"), Some(64 * step), "a beside b and c, step {step}");
    }
    assert_eq!(tokens(&mut ed), 3, "d started in a's first step and decoded in the next two");
    assert_eq!(tokens(&mut eb), 3, "b decoded in each of a's passes");
    // One stream does not hold back two long prompts: streams must outnumber them.
    let mut s = cpu_scheduler(128, true, false);
    s.cfg.long_prefill_chunk = 64;
    let (b, _eb) = GenRequest::new("b".into(), (1..21).collect(), p.clone());
    s.enqueue(b);
    assert!(s.step(&mut rx).is_ok());
    let (a, _ea) = GenRequest::new("a".into(), (1..301).collect(), p.clone());
    let (e, _ee) = GenRequest::new("e".into(), (1..301).collect(), p.clone());
    s.enqueue(a);
    s.enqueue(e);
    for step in 1..=2 {
        assert!(s.step(&mut rx).is_ok());
        assert_eq!((prefilled(&s, "a"), prefilled(&s, "e")), (Some(128 * step), Some(0)), "a and e beside b, step {step}");
    }
}

#[test]
fn mixed_batches_and_decode_ahead_give_the_same_tokens_as_separate_passes() {
    // Greedy requests arriving at different steps, so that prompts are prefilled beside
    // running streams, and ending at different steps (n = 2 for one): on the CPU every row's
    // bits are the same in a mixed pass, and a step launched ahead is the step that would
    // have run next.
    let run = |mixed: bool, ahead: bool| -> Vec<Vec<String>> {
        let mut s = cpu_scheduler(64, mixed, ahead);
        let (_tx, mut rx) = mpsc::channel(4);
        let greedy = deltaserve_engine::SamplingParams { temperature: 0.0, ..Default::default() };
        let p = GenParams { max_tokens: 12, ignore_eos: true, logprobs: Some(0), sampling: greedy, ..params() };
        let mut events = Vec::new();
        for (i, len) in [70usize, 30, 150, 5].into_iter().enumerate() {
            let prompt: Vec<u32> = (0..len as u32).map(|t| (t * 7 + i as u32) % 200 + 1).collect();
            let p = GenParams { max_tokens: 12 - 2 * i, n: 1 + (i == 1) as usize, ..p.clone() };
            let (r, e) = GenRequest::new(format!("r{i}"), prompt, p);
            s.enqueue(r);
            events.push(e);
            assert!(s.step(&mut rx).is_ok());
        }
        while !s.requests.is_empty() || !s.waiting.is_empty() {
            assert!(s.step(&mut rx).is_ok());
        }
        events
            .iter_mut()
            .map(|e| {
                std::iter::from_fn(|| e.try_recv().ok())
                    .filter_map(|ev| match ev {
                        Event::Token { text, logprob, .. } => Some(format!("{text:?}:{logprob:?}")),
                        _ => None,
                    })
                    .collect()
            })
            .collect()
    };
    let separate = run(false, false);
    assert_eq!(separate.len(), 4);
    for (i, s) in separate.iter().enumerate() {
        let choices = 1 + (i == 1) as usize;
        assert_eq!(s.len(), (12 - 2 * i) * choices, "request {i}: {s:?}");
        assert!(s.iter().all(|t| t.contains("Some(TokenLogprob")), "request {i}: {s:?}");
    }
    for (mixed, ahead) in [(true, false), (false, true), (true, true)] {
        assert_eq!(run(mixed, ahead), separate, "mixed batches {mixed}, decode ahead {ahead}");
    }
}

#[test]
fn a_decode_step_is_launched_ahead_only_when_nothing_else_could_run_first() {
    let (tx, mut rx) = mpsc::channel(4);
    let p = GenParams { ignore_eos: true, ..params() };
    // One stream with tokens to go: its next step is launched ahead, drawn first thing in
    // the next engine step, and the one after it launched ahead in turn.
    let mut s = cpu_scheduler(64, true, true);
    let (a, mut ea) = GenRequest::new("a".into(), (1..20).collect(), GenParams { max_tokens: 6, ..p.clone() });
    s.enqueue(a);
    // Step 1: the prompt's token and a decode step's; the third token's step goes ahead.
    assert!(s.step(&mut rx).is_ok() && s.ahead.is_some(), "a decode step with tokens to go");
    assert_eq!(tokens(&mut ea), 2);
    // Steps 2-4: the step ahead (3, 4, 5), the next launched before its emit.
    for k in 3..=5 {
        assert!(s.step(&mut rx).is_ok() && s.ahead.is_some(), "token {k}: the next step goes ahead");
        assert_eq!(tokens(&mut ea), 1, "token {k}");
    }
    // Step 5: the sixth, the last: nothing ahead.
    assert!(s.step(&mut rx).is_ok() && s.ahead.is_none() && s.requests.is_empty());
    assert_eq!(tokens(&mut ea), 1);
    // A request waiting: its prefill must not wait behind a step launched ahead. Nor one in
    // the engine's channel.
    let (b, _eb) = GenRequest::new("b".into(), (1..20).collect(), GenParams { max_tokens: 20, ..p.clone() });
    s.enqueue(b);
    let (d, _ed) = GenRequest::new("d".into(), (1..20).collect(), p.clone());
    assert!(s.step(&mut rx).is_ok() && s.ahead.is_some(), "b decodes alone");
    s.enqueue(d);
    s.finish_ahead(|| false);
    assert!(s.ahead.is_none(), "d waits: b's step after the one ahead is not launched");
    s.decode(|| false);
    assert!(s.ahead.is_none(), "d waits");
    assert!(s.step(&mut rx).is_ok() && s.ahead.is_none(), "d's prompt in a mixed pass with b");
    assert!(s.step(&mut rx).is_ok() && s.ahead.is_some(), "d and b decode");
    let (e, _ee) = GenRequest::new("e".into(), (1..20).collect(), p.clone());
    tx.try_send(Msg::Request(Box::new(e))).ok().unwrap();
    s.finish_ahead(|| !rx.is_empty());
    assert!(s.ahead.is_none(), "e is in the channel");
    s.decode(|| !rx.is_empty());
    assert!(s.ahead.is_none(), "e is still in the channel");
    // A request that reaches the channel while a step launched ahead runs is prefilled in
    // the engine step that draws it, before any other decode step.
    assert!(s.receive(&mut rx).is_ok() && s.step(&mut rx).is_ok());
    assert!(s.step(&mut rx).is_ok() && s.ahead.is_some(), "b, d and e decode");
    let (f, mut ef) = GenRequest::new("f".into(), (1..20).collect(), p.clone());
    tx.try_send(Msg::Request(Box::new(f))).ok().unwrap();
    assert!(s.step(&mut rx).is_ok() && s.ahead.is_none(), "f's prompt in a mixed pass");
    assert_eq!(tokens(&mut ef), 1, "f's first token, in the step that drew the one ahead");
    // Every row ends by length with the tokens just drawn: no step ahead (a chat client's
    // next turn would wait for it).
    let mut s = cpu_scheduler(64, true, true);
    let (c, mut ec) = GenRequest::new("c".into(), (1..20).collect(), GenParams { max_tokens: 2, ..p.clone() });
    s.enqueue(c);
    s.admit();
    assert_eq!(s.prefill(64, 64), (19, false, 0));
    s.decode(|| false);
    assert!(s.ahead.is_none(), "c ended with its second token");
    assert_eq!(tokens(&mut ec), 2);
}

#[test]
fn a_full_channel_is_a_full_queue_and_a_closed_one_a_stopped_engine() {
    let (tx, rx) = mpsc::channel(1);
    let handle = SchedulerHandle { tx, shared: Arc::new(Shared::default()), max_num_seqs: 2, max_queue: 6 };
    let (a, _ra) = GenRequest::new("a".into(), vec![1], params());
    assert_eq!(handle.submit(a), Ok(()));
    let (b, _rb) = GenRequest::new("b".into(), vec![1], params());
    assert_eq!(handle.submit(b), Err(SchedulerError::QueueFull { in_flight: 1, slots: 2, queue: 6 }));
    assert_eq!(handle.in_flight(), 1, "the refused request is not counted");
    drop(rx);
    let (c, _rc) = GenRequest::new("c".into(), vec![1], params());
    assert_eq!(handle.submit(c), Err(SchedulerError::Stopped));
}

#[test]
fn the_event_channel_holds_every_event_a_request_can_produce() {
    let (req, mut rx) = GenRequest::new("r".into(), vec![1, 2, 3], GenParams { n: 2, ..params() });
    // Prompt logprobs for each prompt token, then per choice 4 tokens, a text and a finish,
    // then an error: all fit without a reader.
    for _ in 0..3 {
        req.events.try_send(Event::PromptLogprobs(vec![])).unwrap();
    }
    for choice in 0..2 {
        for _ in 0..4 {
            req.events.try_send(Event::Token { choice, text: String::new(), logprob: None }).unwrap();
        }
        req.events.try_send(Event::Text { choice, text: String::new() }).unwrap();
        req.events.try_send(Event::Finished { choice, reason: FinishReason::Length, tokens: 4 }).unwrap();
    }
    req.events.try_send(Event::Error(SchedulerError::ShutDown)).unwrap();
    assert!(matches!(rx.try_recv(), Ok(Event::PromptLogprobs(_))));
}
