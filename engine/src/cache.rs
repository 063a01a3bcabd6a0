//! The per-sequence caches the layers declare. Each token mixer says what one sequence needs
//! from it ([`CacheSpec`]); the [`StatePool`](crate::StatePool) is built from the model's list,
//! so a new layer kind declares its cache here and leaves the pool and the scheduler alone.

/// What one layer keeps per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSpec {
    /// A recurrent layer (Gated DeltaNet, Gated DeltaProduct): a fixed-size state whatever the
    /// sequence length.
    Recurrent {
        /// f32 values of the short convolution's state, `[C, W]`.
        conv_state: usize,
        /// f32 values of the recurrent state, `[HV, K, V]`.
        recurrent_state: usize,
    },
}

impl CacheSpec {
    /// Bytes per sequence.
    pub fn bytes_per_sequence(&self) -> usize {
        match *self {
            CacheSpec::Recurrent { conv_state, recurrent_state } => (conv_state + recurrent_state) * std::mem::size_of::<f32>(),
        }
    }
}
