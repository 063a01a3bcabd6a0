//! The prefix cache's index: a radix tree over token ids whose nodes may hold a snapshot (a
//! pool snapshot slot with the caches after exactly the node's tokens), with least-recently
//! used eviction. The snapshots themselves live in the [`StatePool`]; this module decides
//! which prefixes they stand for and which one goes when room is needed. With a host tier, a
//! snapshot evicted from the pool's (GPU) memory moves to host memory, and only the least
//! recently used host snapshot is dropped.
//!
//! Snapshots are taken on a grid (every `grid` tokens, a multiple of the prefill's chunk), so
//! a sequence restored from one is cut where an uncached prefill would cut it too: the cache
//! changes no bits (see `docs/prefix-cache.md`).

use std::collections::{BTreeSet, HashMap};

use deltaserve_engine::{HostSnapId, SlotId, SnapId, SnapshotAt, StatePool};

/// Where a node's snapshot is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stored {
    /// A snapshot slot of the pool.
    Device(SnapId),
    /// A slot of the pool's host tier.
    Host(HostSnapId),
}

/// A node: the tokens on the edge from its parent, and a snapshot of the caches after the
/// whole path from the root, if one is kept.
#[derive(Debug, Default)]
struct Node {
    edge: Vec<u32>,
    parent: usize,
    children: HashMap<u32, usize>,
    /// Tokens from the root to the end of `edge`.
    depth: usize,
    snap: Option<Stored>,
    last_used: u64,
}

/// What a lookup found: the longest cached prefix's length and its snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hit {
    pub tokens: usize,
    pub snap: Stored,
}

/// The radix index over cached prefixes.
#[derive(Debug)]
pub(super) struct PrefixCache {
    nodes: Vec<Node>,
    free_nodes: Vec<usize>,
    /// `(last_used, node)` of every node with a snapshot in the pool, oldest first.
    lru: BTreeSet<(u64, usize)>,
    /// The same for snapshots in the host tier.
    host_lru: BTreeSet<(u64, usize)>,
    tick: u64,
    /// Tokens between snapshots (a multiple of the prefill chunk).
    pub grid: usize,
    /// Snapshots dropped to make room, since start.
    pub evictions: u64,
    /// Snapshots moved to the host tier to make room, since start.
    pub spills: u64,
    /// Snapshots indexed or dropped, since start (the gauges need recounting when it moves).
    pub changes: u64,
}

const ROOT: usize = 0;

impl PrefixCache {
    /// An empty index taking snapshots every `grid` tokens.
    pub fn new(grid: usize) -> Self {
        Self {
            nodes: vec![Node::default()],
            free_nodes: Vec::new(),
            lru: BTreeSet::new(),
            host_lru: BTreeSet::new(),
            tick: 0,
            grid,
            evictions: 0,
            spills: 0,
            changes: 0,
        }
    }

    /// Snapshots indexed, in the pool and in the host tier.
    pub fn entries(&self) -> usize {
        self.lru.len() + self.host_lru.len()
    }

    /// Snapshots indexed in the host tier.
    pub fn host_entries(&self) -> usize {
        self.host_lru.len()
    }

    fn lru_of(&mut self, snap: Stored) -> &mut BTreeSet<(u64, usize)> {
        match snap {
            Stored::Device(_) => &mut self.lru,
            Stored::Host(_) => &mut self.host_lru,
        }
    }

    /// Walks `tokens` from the root: the nodes whose whole path is a prefix of `tokens`.
    fn path(&self, tokens: &[u32]) -> Vec<usize> {
        let mut at = ROOT;
        let mut path = vec![ROOT];
        loop {
            let d = self.nodes[at].depth;
            let Some(&child) = tokens.get(d).and_then(|t| self.nodes[at].children.get(t)) else { break };
            let edge = &self.nodes[child].edge;
            if tokens.len() < d + edge.len() || tokens[d..d + edge.len()] != edge[..] {
                break;
            }
            at = child;
            path.push(at);
        }
        path
    }

    fn touch(&mut self, node: usize) {
        self.tick += 1;
        let (tick, last, snap) = (self.tick, self.nodes[node].last_used, self.nodes[node].snap);
        if let Some(snap) = snap {
            let lru = self.lru_of(snap);
            lru.remove(&(last, node));
            lru.insert((tick, node));
        }
        self.nodes[node].last_used = tick;
    }

    /// The longest cached prefix of `tokens` of at most `max` tokens, marked as just used.
    pub fn lookup(&mut self, tokens: &[u32], max: usize) -> Option<Hit> {
        let best = self.path(tokens).into_iter().rev().find(|&n| self.nodes[n].snap.is_some() && self.nodes[n].depth <= max)?;
        self.touch(best);
        let n = &self.nodes[best];
        Some(Hit { tokens: n.depth, snap: n.snap? })
    }

    /// Whether exactly `tokens` is cached (marked as just used when it is).
    pub fn has(&mut self, tokens: &[u32]) -> bool {
        let last = *self.path(tokens).last().unwrap_or(&ROOT);
        let found = self.nodes[last].depth == tokens.len() && self.nodes[last].snap.is_some();
        if found {
            self.touch(last);
        }
        found
    }

    fn new_node(&mut self, node: Node) -> usize {
        match self.free_nodes.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    /// Indexes `snap` as the caches after `tokens`. When that prefix already has a snapshot,
    /// nothing changes and `snap` comes back for the caller to drop.
    pub fn insert(&mut self, tokens: &[u32], snap: SnapId) -> Result<(), SnapId> {
        let mut at = *self.path(tokens).last().unwrap_or(&ROOT);
        let d = self.nodes[at].depth;
        if d < tokens.len() {
            let first = tokens[d];
            match self.nodes[at].children.get(&first).copied() {
                None => {
                    let leaf = Node { edge: tokens[d..].to_vec(), parent: at, depth: tokens.len(), ..Node::default() };
                    let leaf = self.new_node(leaf);
                    self.nodes[at].children.insert(first, leaf);
                    at = leaf;
                }
                Some(child) => {
                    // The child's edge and `tokens` part inside the edge: split it there.
                    let edge = &self.nodes[child].edge;
                    let common = edge.iter().zip(&tokens[d..]).take_while(|(a, b)| a == b).count();
                    let mid = Node { edge: edge[..common].to_vec(), parent: at, depth: d + common, ..Node::default() };
                    let mid = self.new_node(mid);
                    let rest = self.nodes[child].edge[common..].to_vec();
                    self.nodes[mid].children.insert(rest[0], child);
                    self.nodes[child].edge = rest;
                    self.nodes[child].parent = mid;
                    self.nodes[at].children.insert(first, mid);
                    at = mid;
                    if d + common < tokens.len() {
                        let leaf = Node { edge: tokens[d + common..].to_vec(), parent: mid, depth: tokens.len(), ..Node::default() };
                        let leaf = self.new_node(leaf);
                        self.nodes[mid].children.insert(tokens[d + common], leaf);
                        at = leaf;
                    }
                }
            }
        }
        if self.nodes[at].snap.is_some() {
            self.touch(at);
            return Err(snap);
        }
        self.nodes[at].snap = Some(Stored::Device(snap));
        self.touch(at);
        self.changes += 1;
        Ok(())
    }

    /// Removes node `at`'s snapshot and tidies the tree: a node with neither snapshot nor
    /// children goes, one with a single child merges into it.
    fn unlink(&mut self, at: usize) -> Option<Stored> {
        let n = &mut self.nodes[at];
        let snap = n.snap.take()?;
        let last = n.last_used;
        self.lru_of(snap).remove(&(last, at));
        self.changes += 1;
        let mut at = at;
        while at != ROOT && self.nodes[at].snap.is_none() && self.nodes[at].children.len() <= 1 {
            let parent = self.nodes[at].parent;
            let first = self.nodes[at].edge[0];
            if let Some((_, &child)) = self.nodes[at].children.iter().next() {
                // Merge: the child takes this node's edge in front of its own.
                let mut edge = std::mem::take(&mut self.nodes[at].edge);
                edge.extend_from_slice(&self.nodes[child].edge);
                self.nodes[child].edge = edge;
                self.nodes[child].parent = parent;
                self.nodes[parent].children.insert(first, child);
            } else {
                self.nodes[parent].children.remove(&first);
            }
            self.nodes[at] = Node::default();
            self.free_nodes.push(at);
            at = parent;
        }
        Some(snap)
    }

    /// Makes a pool snapshot slot free: the least recently used pool snapshot moves to the host
    /// tier when there is one (dropping the least recently used host snapshot if it is full),
    /// the snapshot holds no KV blocks and it is [worth keeping](Self::worth_keeping); otherwise
    /// it is dropped. False when there is none.
    pub fn evict_one(&mut self, pool: &mut StatePool) -> bool {
        let Some(&(last, node)) = self.lru.iter().next() else { return false };
        if let Some(Stored::Device(snap)) = self.nodes[node].snap {
            if pool.host_snapshots_total() > 0 && pool.snapshot_blocks(snap) == 0 && self.worth_keeping(node) {
                if pool.host_snapshots_free() == 0 {
                    self.drop_lru(pool, true);
                }
                if let Ok(Some(h)) = pool.spill(snap) {
                    self.lru.remove(&(last, node));
                    self.host_lru.insert((last, node));
                    self.nodes[node].snap = Some(Stored::Host(h));
                    self.spills += 1;
                    self.changes += 1;
                    return true;
                }
            }
        }
        self.drop_lru(pool, false)
    }

    /// Whether `node`'s snapshot is the deepest of its path (nothing cached below it) or the
    /// last one before paths part: a snapshot with a single chain of deeper snapshots below
    /// it (a conversation's earlier grid points) is not worth a copy to the host, since every
    /// request that would hit it hits the deeper one at least as well.
    fn worth_keeping(&self, node: usize) -> bool {
        let mut at = node;
        loop {
            let children = &self.nodes[at].children;
            let Some(&child) = children.values().next() else { return true };
            if children.len() > 1 {
                return true;
            }
            if self.nodes[child].snap.is_some() {
                return false;
            }
            at = child;
        }
    }

    /// Drops the least recently used snapshot of the host tier or of the pool. False when
    /// there is none.
    fn drop_lru(&mut self, pool: &mut StatePool, host: bool) -> bool {
        let lru = if host { &self.host_lru } else { &self.lru };
        let Some(&(_, node)) = lru.iter().next() else { return false };
        // Cannot fail: indexed snapshots are taken slots.
        match self.unlink(node) {
            Some(Stored::Device(snap)) => {
                let _ = pool.drop_snapshot(snap);
            }
            Some(Stored::Host(h)) => {
                let _ = pool.drop_host(h);
            }
            None => return true,
        }
        self.evictions += 1;
        true
    }

    /// A free snapshot slot, evicting the least recently used snapshot when none is free.
    pub fn take_slot(&mut self, pool: &mut StatePool) -> Option<SnapId> {
        loop {
            if let Some(s) = pool.take_snapshot() {
                return Some(s);
            }
            if !self.evict_one(pool) {
                return None;
            }
        }
    }

    /// Evicts snapshots holding KV blocks, least recently used first, until `blocks` blocks
    /// are available to sequences or no snapshot holds any.
    pub fn free_blocks(&mut self, pool: &mut StatePool, blocks: usize) {
        while pool.kv_blocks_available() < blocks {
            let holds = |n: usize| matches!(self.nodes[n].snap, Some(Stored::Device(s)) if pool.snapshot_blocks(s) > 0);
            let Some(node) = self.lru.iter().find(|&&(_, n)| holds(n)).map(|&(_, n)| n) else { return };
            if let Some(Stored::Device(snap)) = self.unlink(node) {
                let _ = pool.drop_snapshot(snap);
                self.evictions += 1;
            }
        }
    }
}

impl PrefixCache {
    /// The snapshots to take in a pass over `pieces` (`(slot, the sequence's tokens, where the
    /// piece starts, its length)`): every grid point inside a piece that the index lacks, each
    /// given a slot (evicting when none is free; none taken when nothing can be evicted).
    /// Returns them with, for each, `(piece, prefix length)` to index it under after the pass.
    pub fn plan_snapshots(
        &mut self,
        pool: &mut StatePool,
        pieces: &[(SlotId, &[u32], usize, usize)],
    ) -> (Vec<SnapshotAt>, Vec<(usize, usize)>) {
        let (mut snaps, mut keys) = (Vec::new(), Vec::new());
        for (seq, &(_, tokens, from, take)) in pieces.iter().enumerate() {
            let first = from / self.grid + 1;
            for p in (first * self.grid..=from + take).step_by(self.grid) {
                let key = &tokens[..p];
                // (Pieces start on chunk boundaries; the check keeps a bad start from failing the pass.)
                if !(p - from).is_multiple_of(deltaserve_engine::PREFILL_CHUNK)
                    || self.has(key)
                    || keys.iter().any(|&(s, l): &(usize, usize)| l == p && pieces[s].1[..l] == *key)
                {
                    continue;
                }
                let Some(snap) = self.take_slot(pool) else { return (snaps, keys) };
                snaps.push(SnapshotAt { seq, tokens: p - from, snap });
                keys.push((seq, p));
            }
        }
        (snaps, keys)
    }
}

/// Makes sequence slot `slot` continue from a snapshot wherever it is; `Ok(false)` as
/// [`StatePool::restore`] gives it.
pub(super) fn restore(pool: &mut StatePool, snap: Stored, slot: SlotId) -> deltaserve_engine::Result<bool> {
    match snap {
        Stored::Device(s) => pool.restore(s, slot),
        Stored::Host(h) => pool.restore_host(h, slot).map(|()| true),
    }
}

/// Tokens two prompts share from the start.
pub(super) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltaserve_engine::cache::CacheSpec;
    use deltaserve_engine::state::PoolSize;
    use deltaserve_engine::Device;

    fn pool(snapshots: usize) -> StatePool {
        let specs = [CacheSpec::Recurrent { conv_state: 2, recurrent_state: 2, state_dtype: deltaserve_engine::DType::F32 }];
        let size = PoolSize { slots: 1, snapshots, kv_blocks: 0, block_size: 16, max_seq_len: 0 };
        StatePool::new_on(&specs, size, &Device::Cpu).unwrap()
    }

    #[test]
    fn lookup_finds_the_longest_cached_prefix_within_the_limit() {
        let mut p = pool(4);
        let mut c = PrefixCache::new(2);
        let (a, b, d) = (p.take_snapshot().unwrap(), p.take_snapshot().unwrap(), p.take_snapshot().unwrap());
        c.insert(&[1, 2], a).unwrap();
        c.insert(&[1, 2, 3, 4], b).unwrap();
        c.insert(&[1, 2, 5, 6], d).unwrap(); // splits nothing: a new branch under [1, 2]
        assert_eq!(c.lookup(&[1, 2, 3, 4, 9], 4), Some(Hit { tokens: 4, snap: Stored::Device(b) }));
        assert_eq!(c.lookup(&[1, 2, 3, 4], 3), Some(Hit { tokens: 2, snap: Stored::Device(a) }), "at most 3 tokens");
        assert_eq!(c.lookup(&[1, 2, 5, 7], 9), Some(Hit { tokens: 2, snap: Stored::Device(a) }), "mid-edge is no hit");
        assert_eq!(c.lookup(&[7], 9), None);
        assert_eq!(c.insert(&[1, 2, 3, 4], p.take_snapshot().unwrap()).unwrap_err().index(), 4, "a duplicate comes back");
        assert!(c.has(&[1, 2, 5, 6]) && !c.has(&[1, 2, 5]));
    }

    #[test]
    fn an_insert_inside_an_edge_splits_it_and_eviction_merges_it_back() {
        let mut p = pool(3);
        let mut c = PrefixCache::new(2);
        let (long, short) = (p.take_snapshot().unwrap(), p.take_snapshot().unwrap());
        c.insert(&[1, 2, 3, 4, 5, 6], long).unwrap();
        c.insert(&[1, 2, 3], short).unwrap();
        assert_eq!(c.lookup(&[1, 2, 3, 4, 5, 6, 7], 9).map(|h| h.tokens), Some(6));
        assert_eq!(c.lookup(&[1, 2, 3, 9], 9).map(|h| h.tokens), Some(3));
        // `short` was used last: `long` is evicted first, and the tree shrinks back.
        assert!(c.evict_one(&mut p));
        assert_eq!((c.entries(), c.evictions, p.snapshots_used()), (1, 1, 1));
        assert_eq!(c.lookup(&[1, 2, 3, 4, 5, 6], 9).map(|h| h.tokens), Some(3));
        assert!(c.evict_one(&mut p) && !c.evict_one(&mut p));
        assert_eq!(c.nodes.iter().filter(|n| n.depth > 0).count(), 0, "no nodes left but the root");
    }

    #[test]
    fn eviction_moves_the_deepest_snapshots_to_the_host_and_drops_those_above_them() {
        let mut p = pool(2);
        p.add_host_tier(1).unwrap();
        let mut c = PrefixCache::new(2);
        let a = c.take_slot(&mut p).unwrap();
        c.insert(&[1, 2], a).unwrap();
        let b = c.take_slot(&mut p).unwrap();
        c.insert(&[1, 2, 3, 4], b).unwrap();
        // [1, 2] is least recently used, but [1, 2, 3, 4] is cached below it on one path.
        let d = c.take_slot(&mut p).unwrap();
        assert_eq!((c.evictions, c.spills, c.host_entries()), (1, 0, 0), "dropped, not copied");
        c.insert(&[7, 8], d).unwrap();
        // [1, 2, 3, 4] is now the least recently used and the deepest of its path: to the host.
        let e = c.take_slot(&mut p).unwrap();
        assert_eq!((c.evictions, c.spills, c.host_entries(), c.entries()), (1, 1, 1, 2));
        let hit = c.lookup(&[1, 2, 3, 4, 5], 9).unwrap();
        assert!(matches!(hit, Hit { tokens: 4, snap: Stored::Host(_) }), "{hit:?}");
        c.insert(&[9, 9], e).unwrap();
        // The host tier is full: moving [7, 8] there drops its least recently used snapshot.
        let _ = c.take_slot(&mut p).unwrap();
        assert_eq!((c.evictions, c.spills, c.host_entries()), (2, 2, 1));
        assert!(c.lookup(&[1, 2, 3, 4], 9).is_none() && c.lookup(&[7, 8, 1], 9).is_some());
        // A prefix where paths part is kept too: [5, 5] with two deeper branches.
        let mut p = pool(3);
        p.add_host_tier(2).unwrap();
        let mut c = PrefixCache::new(2);
        for key in [&[5u32, 5][..], &[5, 5, 1, 1], &[5, 5, 2, 2]] {
            let s = c.take_slot(&mut p).unwrap();
            c.insert(key, s).unwrap();
        }
        let _ = c.take_slot(&mut p).unwrap();
        assert_eq!((c.evictions, c.spills), (0, 1), "[5, 5] went to the host");
    }

    #[test]
    fn taking_a_slot_evicts_the_least_recently_used_snapshot() {
        let mut p = pool(2);
        let mut c = PrefixCache::new(2);
        let a = c.take_slot(&mut p).unwrap();
        c.insert(&[1, 1], a).unwrap();
        let b = c.take_slot(&mut p).unwrap();
        c.insert(&[2, 2], b).unwrap();
        assert!(c.lookup(&[1, 1, 1], 2).is_some(), "touch [1, 1]");
        let d = c.take_slot(&mut p).unwrap();
        assert_eq!(d, b, "[2, 2] was least recently used");
        assert!(c.lookup(&[2, 2, 2], 2).is_none() && c.lookup(&[1, 1, 1], 2).is_some());
    }
}
