//! Where a group's rank threads meet for one collective: each leaves its part, the last to
//! arrive turns all the parts into every rank's result, and each takes its own.
//!
//! A rank whose pass fails stops meeting, so the meeting can be called off ([`Meeting::abort`]):
//! the ranks waiting in it, and any that arrive later, get an error instead of waiting forever.
//! Once every rank's thread has left the pass, [`Meeting::reset`] makes it usable again. A
//! collective is combined only when every part is in, so an aborted one left nothing half done
//! (on GPUs: no all-reduce queued on some GPUs and not on others).

use std::sync::{Condvar, Mutex, MutexGuard};

use crate::error::{EngineError, Result};

/// A meeting of a fixed number of ranks; every rank must meet the same number of times.
#[derive(Debug)]
pub(crate) struct Meeting<T> {
    round: Mutex<Round<T>>,
    changed: Condvar,
}

#[derive(Debug)]
struct Round<T> {
    /// Each rank's part of the collective being gathered.
    parts: Vec<Option<T>>,
    /// Each rank's result of the last combined collective, until it takes it.
    results: Vec<Option<std::result::Result<T, String>>>,
    /// Parts in so far.
    arrived: usize,
    /// Results not yet taken: nobody leaves a new part until they are all taken.
    untaken: usize,
    /// Counts combined collectives (a waiting rank sees its own combined when it moves).
    combined: u64,
    /// Why the meeting was called off, if it was.
    aborted: Option<String>,
}

fn failed(actual: String) -> EngineError {
    EngineError::Invalid { field: "tensor parallel collective", expected: "every rank's part".into(), actual }
}

impl<T> Meeting<T> {
    /// A meeting of `size` ranks.
    pub(crate) fn new(size: usize) -> Self {
        let round = Round {
            parts: (0..size).map(|_| None).collect(),
            results: (0..size).map(|_| None).collect(),
            arrived: 0,
            untaken: 0,
            combined: 0,
            aborted: None,
        };
        Self { round: Mutex::new(round), changed: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, Round<T>> {
        self.round.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, Round<T>>) -> MutexGuard<'a, Round<T>> {
        self.changed.wait(g).unwrap_or_else(|p| p.into_inner())
    }

    /// Leaves `part` for rank `rank` and returns its result; `combine` (run by the last rank to
    /// arrive, with the parts in rank order) makes every rank's result.
    pub(crate) fn exchange(&self, rank: usize, part: T, combine: impl FnOnce(Vec<T>) -> Result<Vec<T>>) -> Result<T> {
        let mut g = self.lock();
        let size = g.parts.len();
        if rank >= size {
            return Err(EngineError::Invalid {
                field: "tensor parallel rank",
                expected: format!("a rank below the group size {size}"),
                actual: rank.to_string(),
            });
        }
        while g.untaken > 0 && g.aborted.is_none() {
            g = self.wait(g);
        }
        if let Some(why) = &g.aborted {
            return Err(failed(why.clone()));
        }
        g.parts[rank] = Some(part);
        g.arrived += 1;
        let mine = g.combined;
        if g.arrived == size {
            let parts: Vec<T> = g.parts.iter_mut().filter_map(Option::take).collect();
            let results: Vec<std::result::Result<T, String>> = match combine(parts) {
                Ok(r) if r.len() == size => r.into_iter().map(Ok).collect(),
                Ok(r) => (0..size).map(|_| Err(format!("{size} results; got {}", r.len()))).collect(),
                Err(e) => (0..size).map(|_| Err(e.to_string())).collect(),
            };
            g.results = results.into_iter().map(Some).collect();
            g.arrived = 0;
            g.untaken = size;
            g.combined += 1;
            self.changed.notify_all();
        } else {
            while g.combined == mine && g.aborted.is_none() {
                g = self.wait(g);
            }
            if g.combined == mine {
                let why = g.aborted.clone().unwrap_or_default();
                return Err(failed(why));
            }
        }
        let out = g.results[rank].take();
        g.untaken -= 1;
        if g.untaken == 0 {
            self.changed.notify_all();
        }
        match out {
            Some(Ok(t)) => Ok(t),
            Some(Err(e)) => Err(failed(e)),
            None => Err(failed("no result".into())),
        }
    }

    /// Calls the meeting off: ranks waiting in it, or arriving later, fail with `why`.
    pub(crate) fn abort(&self, why: &str) {
        let mut g = self.lock();
        if g.aborted.is_none() {
            g.aborted = Some(why.to_string());
        }
        self.changed.notify_all();
    }

    /// Clears an aborted or half-gathered meeting; only while no rank is in it.
    pub(crate) fn reset(&self) {
        let mut g = self.lock();
        g.parts.iter_mut().for_each(|p| *p = None);
        g.results.iter_mut().for_each(|r| *r = None);
        g.arrived = 0;
        g.untaken = 0;
        g.aborted = None;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Meeting;

    fn add(parts: Vec<u32>) -> crate::error::Result<Vec<u32>> {
        let total = parts.iter().sum();
        Ok(vec![total; parts.len()])
    }

    #[test]
    fn every_rank_gets_the_combined_result_round_after_round() {
        let m = Meeting::new(3);
        std::thread::scope(|s| {
            let jobs: Vec<_> = (0..3u32)
                .map(|r| {
                    let m = &m;
                    s.spawn(move || (1..=50).map(|round| m.exchange(r as usize, r * round, add).unwrap()).collect::<Vec<_>>())
                })
                .collect();
            for j in jobs {
                // Parts 0·k + 1·k + 2·k in round k.
                assert_eq!(j.join().unwrap(), (1..=50).map(|k| 3 * k).collect::<Vec<_>>());
            }
        });
    }

    #[test]
    fn an_abort_releases_the_waiting_ranks_and_a_reset_lets_them_meet_again() {
        let m = Meeting::new(2);
        std::thread::scope(|s| {
            let waiting = s.spawn(|| m.exchange(0, 5, add));
            std::thread::sleep(Duration::from_millis(50));
            m.abort("rank 1 failed: out of memory");
            let err = waiting.join().unwrap().unwrap_err().to_string();
            assert!(err.contains("rank 1 failed: out of memory"), "{err}");
        });
        // Called off for latecomers too, until reset.
        assert!(m.exchange(1, 7, add).is_err());
        m.reset();
        std::thread::scope(|s| {
            let a = s.spawn(|| m.exchange(0, 5, add).unwrap());
            let b = s.spawn(|| m.exchange(1, 7, add).unwrap());
            assert_eq!((a.join().unwrap(), b.join().unwrap()), (12, 12));
        });
    }

    #[test]
    fn a_failed_combine_fails_every_rank_and_the_next_round_works() {
        let m = Meeting::new(2);
        let fail = |_: Vec<u32>| -> crate::error::Result<Vec<u32>> {
            Err(crate::error::EngineError::Invalid { field: "x", expected: "y".into(), actual: "nccl said no".into() })
        };
        std::thread::scope(|s| {
            let a = s.spawn(|| m.exchange(0, 1, fail));
            let b = s.spawn(|| m.exchange(1, 2, fail));
            assert!(a.join().unwrap().unwrap_err().to_string().contains("nccl said no"));
            assert!(b.join().unwrap().is_err());
        });
        std::thread::scope(|s| {
            let a = s.spawn(|| m.exchange(0, 1, add).unwrap());
            let b = s.spawn(|| m.exchange(1, 2, add).unwrap());
            assert_eq!((a.join().unwrap(), b.join().unwrap()), (3, 3));
        });
    }
}
