//! Placement of a captured graph's allocations in one arena (`cuda::graph` rebuilds graphs over
//! it): buffers alive at the same time never overlap, and a buffer freed before another is
//! allocated lends it its place. A stream's graphs share an arena; [`grown`] sizes the next.

const MIB: u64 = 1 << 20;

/// The size of a stream's next arena when its current one (`current` bytes, if any) is too small
/// for `needed`: at least twice the current one, rounded up to whole MiB. Graphs keep the arena
/// they were built over, so graphs captured at growing batch sizes (the server's warm-up) would
/// otherwise keep one arena each; doubling keeps the arenas alive under twice the largest.
pub fn grown(current: Option<u64>, needed: u64) -> u64 {
    let want = needed.max(current.map_or(0, |c| c.saturating_mul(2)));
    want.div_ceil(MIB).max(1) * MIB
}

/// One buffer's size in bytes and the positions, in the graph's node order, of its allocation
/// and its free (`start < end`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    /// Bytes.
    pub size: u64,
    /// Position of the allocation.
    pub start: usize,
    /// Position of the free.
    pub end: usize,
}

/// Offsets for `buffers` (given in order of allocation) in an arena, each a multiple of `align`,
/// first fit among the buffers still alive at its allocation; and the arena's size (at least
/// `align`). A buffer freed at the position another is allocated at is no longer alive.
pub fn place(buffers: &[Lifetime], align: u64) -> (Vec<u64>, u64) {
    let mut alive: Vec<(u64, u64, usize)> = Vec::new(); // (offset, rounded size, end)
    let mut offsets = Vec::with_capacity(buffers.len());
    let mut total = 0u64;
    for b in buffers {
        alive.retain(|&(_, _, end)| end > b.start);
        alive.sort_unstable();
        let size = b.size.div_ceil(align).max(1) * align;
        let mut at = 0u64;
        for &(off, sz, _) in &alive {
            if at + size <= off {
                break;
            }
            at = at.max(off + sz);
        }
        offsets.push(at);
        alive.push((at, size, b.end));
        total = total.max(at + size);
    }
    (offsets, total.max(align))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn life(size: u64, start: usize, end: usize) -> Lifetime {
        Lifetime { size, start, end }
    }

    #[test]
    fn buffers_alive_together_do_not_overlap_and_freed_places_are_reused() {
        // 0 and 1 overlap in time; 2 starts after 0 is freed and fits in its place.
        let (offsets, total) = place(&[life(1000, 0, 5), life(600, 1, 9), life(512, 6, 8)], 512);
        assert_eq!(offsets, vec![0, 1024, 0]);
        assert_eq!(total, 2048);
        // Freed at the very position the next is allocated at: the place is free again.
        assert_eq!(place(&[life(512, 0, 3), life(512, 3, 4)], 512), (vec![0, 0], 512));
        // Nothing to place: the arena is still one aligned unit.
        assert_eq!(place(&[], 256), (vec![], 256));
    }

    #[test]
    fn arenas_grown_for_growing_graphs_stay_under_twice_the_largest() {
        // A warm-up's graphs, each needing 1 MiB more than the one before (10 MiB to 265 MiB):
        // every arena fits what its graph needs, and all of them together (each graph keeps
        // its own) stay under twice the largest.
        let mut arenas: Vec<u64> = Vec::new();
        for step in 0..256u64 {
            let needed = (10 + step) * MIB - 123;
            if arenas.last().is_none_or(|&a| a < needed) {
                arenas.push(grown(arenas.last().copied(), needed));
            }
            let current = *arenas.last().unwrap_or(&0);
            assert!(current >= needed && current.is_multiple_of(MIB), "arena {current} for {needed}");
        }
        let largest = *arenas.iter().max().unwrap_or(&0);
        assert!(arenas.iter().sum::<u64>() < 2 * largest, "{arenas:?}");
        let mib: Vec<u64> = arenas.iter().map(|a| a / MIB).collect();
        assert_eq!(mib, vec![10, 20, 40, 80, 160, 320]);
    }

    #[test]
    fn random_lifetimes_never_share_bytes_while_alive() {
        // A small deterministic generator (no dependency): 40 rounds of 60 buffers.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for _ in 0..40 {
            let mut buffers = Vec::new();
            for i in 0..60usize {
                let start = 2 * i;
                buffers.push(life(1 + next(5000), start, start + 1 + next(40) as usize));
            }
            let (offsets, total) = place(&buffers, 512);
            for (i, a) in buffers.iter().enumerate() {
                assert!(offsets[i].is_multiple_of(512));
                assert!(offsets[i] + a.size <= total, "buffer {i} past the arena's end");
                for (j, b) in buffers.iter().enumerate().skip(i + 1) {
                    let together = a.start < b.end && b.start < a.end;
                    let apart = offsets[i] + a.size <= offsets[j] || offsets[j] + b.size <= offsets[i];
                    assert!(!together || apart, "buffers {i} and {j} are alive together and overlap");
                }
            }
        }
    }
}
