//! A tensor parallel model's pool: rank 0's [`StatePool`] holds the other ranks' pools as
//! replicas. Their bookkeeping (slots, snapshots, KV blocks, positions) is the same as rank 0's
//! by construction: every public change is made to rank 0's pool and then to each replica in
//! turn, and each rank's pass updates its own pool the same way. Only their buffers differ:
//! each holds its rank's heads, on its rank's device.

use super::StatePool;

impl StatePool {
    /// Makes `pool` (another rank's, of the same size) a replica of this one. Both must be
    /// fresh: nothing allocated yet.
    pub(crate) fn add_replica(&mut self, pool: StatePool) {
        self.replicas.push(pool);
    }

    /// Tensor parallel ranks this pool serves (1 without replicas).
    pub fn ranks(&self) -> usize {
        1 + self.replicas.len()
    }

    /// Takes the replicas out, so that each rank's pass can borrow its own pool while rank 0's
    /// runs on this one; [`Self::put_replicas`] puts them back.
    pub(crate) fn take_replicas(&mut self) -> Vec<StatePool> {
        std::mem::take(&mut self.replicas)
    }

    /// Puts back what [`Self::take_replicas`] took.
    pub(crate) fn put_replicas(&mut self, replicas: Vec<StatePool>) {
        self.replicas = replicas;
    }

    /// `f` on this pool, then on every replica; this pool's answer. An error on this pool
    /// stops there (the replicas would give the same one); a replica's is returned too.
    pub(super) fn mirrored<T, E>(&mut self, f: impl Fn(&mut StatePool) -> Result<T, E>) -> Result<T, E> {
        let out = f(self)?;
        for r in &mut self.replicas {
            f(r)?;
        }
        Ok(out)
    }
}
