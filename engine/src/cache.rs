//! The per-sequence caches the layers declare. Each token mixer says what one sequence needs
//! from it ([`CacheSpec`]); the [`StatePool`](crate::StatePool) is built from the model's list,
//! so a new layer kind declares its cache here and leaves the pool and the scheduler alone.

use candle_core::DType;

/// What one layer keeps per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSpec {
    /// A recurrent layer (Gated DeltaNet, Gated DeltaProduct): a fixed-size state whatever the
    /// sequence length.
    Recurrent {
        /// f32 values of the short convolution's state, `[C, W]`.
        conv_state: usize,
        /// Values of the recurrent state, `[HV, K, V]`.
        recurrent_state: usize,
        /// The recurrent state's element type in the pool: f32 (the reference's), or bf16 on a
        /// GPU (`--state-dtype bf16`).
        state_dtype: DType,
    },
    /// A softmax-attention layer: keys and values of every token so far, in the pool's paged
    /// KV cache (`[block_size, HKV, hd]` per block, keys after RoPE).
    Attention {
        /// HKV.
        kv_heads: usize,
        /// hd.
        head_dim: usize,
        /// Element type of the cache: f32, or a 16-bit model's own type on a GPU.
        dtype: DType,
    },
}

impl CacheSpec {
    /// Bytes per sequence of the fixed-size part (recurrent layers; attention layers grow by
    /// [`Self::bytes_per_token`]).
    pub fn bytes_per_sequence(&self) -> usize {
        match *self {
            CacheSpec::Recurrent { conv_state, recurrent_state, state_dtype } => {
                conv_state * std::mem::size_of::<f32>() + recurrent_state * state_dtype.size_in_bytes()
            }
            CacheSpec::Attention { .. } => 0,
        }
    }

    /// Bytes per cached token (keys and values; 0 for recurrent layers).
    pub fn bytes_per_token(&self) -> usize {
        match *self {
            CacheSpec::Recurrent { .. } => 0,
            CacheSpec::Attention { kv_heads, head_dim, dtype } => 2 * kv_heads * head_dim * dtype.size_in_bytes(),
        }
    }
}
