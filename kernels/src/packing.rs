//! The index tables of a packed prefill pass in one fixed device buffer, so that the pass can
//! be captured as a CUDA graph and replayed for other sequences of the same shape.
//!
//! A pass launched eagerly uploads its tables (sequence offsets, slots, the chunk list, the
//! snapshot rows) each time, and sizes its grids by them. A captured pass can upload nothing:
//! its kernels read the tables from a buffer whose contents each replay first overwrites, and
//! its grids are sized by capacities fixed at capture: `rows` packed rows, `seqs` sequences,
//! `rows / 64 + seqs` chunks and `rows / 64` snapshot copies. Unused chunk and copy entries have
//! length 0, which the kernels skip. For Gated DeltaProduct, whose mixer runs `n` rows a token,
//! the buffer also holds the tables of the interleaved packing ([`PackedTables::interleaved`]).

use candle_core::{DType, Device, Tensor};

use crate::{Capture, KernelError, Result, PREFILL_CHUNK};

/// The tables of a packed prefill of a fixed shape, in device memory (see the module docs).
#[derive(Debug, Clone)]
pub struct PackedTables {
    /// `[len]` i32: the parts of [`Part`], in that order, from `offset` on; then, with `steps`
    /// > 1, the interleaved packing's.
    buf: Tensor,
    offset: usize,
    rows: usize,
    seqs: usize,
    /// Rows a token of the interleaved packing (1: none).
    steps: usize,
}

/// One table of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Sequence offsets, `seqs + 1` entries from 0 to `rows`.
    Cu,
    /// Each sequence's state slot.
    Slots,
    /// First row of each chunk.
    ChunkRow,
    /// Rows of each chunk (0: unused).
    ChunkLen,
    /// Per row: 1 + the slot that takes the state after the chunk starting there, or 0.
    Snap,
    /// The snapshot copies packed back to back as sequences ending where each copy is taken
    /// (`captures + 1` offsets; the conv state of each is its last rows).
    CaptureCu,
    /// Each copy's slot.
    CaptureSlot,
}

impl PackedTables {
    /// Zeroed tables for passes of `rows` rows in `seqs` sequences, on `device`, and with
    /// `steps` > 1 those of the same packing interleaved `steps` rows a token.
    pub fn new(rows: usize, seqs: usize, steps: usize, device: &Device) -> Result<Self> {
        let steps = steps.max(1);
        let mut len = part_lens(rows, seqs).iter().sum::<usize>();
        if steps > 1 {
            len += part_lens(rows * steps, seqs).iter().sum::<usize>();
        }
        Ok(Self { buf: Tensor::zeros(len, DType::I32, device)?, offset: 0, rows, seqs, steps })
    }

    /// The tables of the interleaved packing (Gated DeltaProduct's mixer: `steps` rows a
    /// token), in the same buffer; `None` without one.
    pub fn interleaved(&self) -> Option<Self> {
        let own = part_lens(self.rows, self.seqs).iter().sum::<usize>();
        (self.steps > 1).then(|| Self { buf: self.buf.clone(), offset: self.offset + own, rows: self.rows * self.steps, steps: 1, ..*self })
    }

    /// Rows a token of the interleaved packing (1: none).
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Packed rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Sequences.
    pub fn seqs(&self) -> usize {
        self.seqs
    }

    /// Chunk entries: enough for any `seqs` sequences of `rows` rows in all.
    pub fn chunks(&self) -> usize {
        part_lens(self.rows, self.seqs)[Part::ChunkRow as usize]
    }

    /// Snapshot copy entries: one per whole chunk.
    pub fn captures(&self) -> usize {
        part_lens(self.rows, self.seqs)[Part::CaptureSlot as usize]
    }

    /// Where `part` lies in the buffer, in elements.
    pub fn range(&self, part: Part) -> std::ops::Range<usize> {
        let lens = part_lens(self.rows, self.seqs);
        let i = part as usize;
        let start = self.offset + lens[..i].iter().sum::<usize>();
        start..start + lens[i]
    }

    /// The buffer, `[len]` i32.
    pub fn tensor(&self) -> &Tensor {
        &self.buf
    }

    /// The buffer's values for a packing of exactly this shape (host side; [`Self::fill`]
    /// writes them): `cu_seqlens` from 0 to `rows` over `seqs` sequences, `captures` as the
    /// prefill ops take them; then the interleaved packing's, if any.
    pub fn values(&self, cu_seqlens: &[usize], slots: &[usize], captures: &[Capture]) -> Result<Vec<i32>> {
        let mut v = self.own_values(cu_seqlens, slots, captures)?;
        if let Some(inner) = self.interleaved() {
            let n = self.steps;
            let cu: Vec<usize> = cu_seqlens.iter().map(|c| c * n).collect();
            let caps: Vec<Capture> = captures.iter().map(|c| Capture { tokens: c.tokens * n, ..*c }).collect();
            v.extend(inner.own_values(&cu, slots, &caps)?);
        }
        Ok(v)
    }

    /// [`Self::values`] without the interleaved packing's.
    fn own_values(&self, cu_seqlens: &[usize], slots: &[usize], captures: &[Capture]) -> Result<Vec<i32>> {
        const OP: &str = "packed_tables";
        if slots.len() != self.seqs || cu_seqlens.len() != self.seqs + 1 || cu_seqlens.last() != Some(&self.rows) {
            return Err(KernelError::Shape {
                op: OP,
                input: "cu_seqlens",
                expected: format!("{} sequences ending at row {}", self.seqs, self.rows),
                actual: cu_seqlens.to_vec(),
            });
        }
        let (mut crow, mut clen) = (Vec::with_capacity(self.chunks()), Vec::with_capacity(self.chunks()));
        for w in cu_seqlens.windows(2) {
            for c0 in (w[0]..w[1]).step_by(PREFILL_CHUNK) {
                crow.push(c0);
                clen.push(PREFILL_CHUNK.min(w[1] - c0));
            }
        }
        if crow.len() > self.chunks() || captures.len() > self.captures() {
            return Err(KernelError::Shape {
                op: OP,
                input: "captures",
                expected: format!("at most {} chunks and {} captures", self.chunks(), self.captures()),
                actual: vec![crow.len(), captures.len()],
            });
        }
        crow.resize(self.chunks(), 0);
        clen.resize(self.chunks(), 0);
        let mut snap = vec![0; self.rows];
        for c in captures {
            snap[cu_seqlens[c.seq] + c.tokens - PREFILL_CHUNK] = c.slot + 1;
        }
        let (mut cap_cu, mut cap_slot) = capture_packing(cu_seqlens, captures);
        let last = cap_cu.last().copied().unwrap_or(0);
        cap_cu.resize(self.captures() + 1, last);
        cap_slot.resize(self.captures(), 0);
        let all = [cu_seqlens, slots, &crow, &clen, &snap, &cap_cu, &cap_slot];
        Ok(all.iter().flat_map(|t| t.iter().map(|&x| x as i32)).collect())
    }

    /// Writes the tables of this packing into the buffer, in stream order (before the pass
    /// that reads them).
    pub fn fill(&self, cu_seqlens: &[usize], slots: &[usize], captures: &[Capture]) -> Result<()> {
        let values = self.values(cu_seqlens, slots, captures)?;
        #[cfg(feature = "cuda")]
        if self.buf.device().is_cuda() {
            return crate::cuda::write_at(&self.buf, self.offset, &values);
        }
        let _ = values;
        Err(KernelError::UnsupportedDevice { op: "packed_tables", device: format!("{:?} (expected cuda)", self.buf.device()) })
    }

    /// Checks that a pass of `rows` rows over `slots` has this shape.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn check(&self, op: &'static str, rows: usize, slots: &[usize]) -> Result<()> {
        if rows != self.rows || slots.len() != self.seqs {
            return Err(KernelError::Shape {
                op,
                input: "packed tables",
                expected: format!("{} rows in {} sequences", self.rows, self.seqs),
                actual: vec![rows, slots.len()],
            });
        }
        Ok(())
    }
}

/// The length of each [`Part`], in order, for `rows` rows in `seqs` sequences.
fn part_lens(rows: usize, seqs: usize) -> [usize; 7] {
    let (chunks, captures) = (rows.div_ceil(PREFILL_CHUNK) + seqs, rows / PREFILL_CHUNK);
    [seqs + 1, seqs, chunks, chunks, rows, captures + 1, captures]
}

/// The snapshot copies of a pass as sequences for the conv-state kernel: sorted by where they
/// are taken, each ending there and starting where the one before ends (the first at row 0).
/// Copies are at least a chunk apart and a chunk into their sequence, so each spans at least
/// a conv window. Returns the offsets (`captures + 1`, empty without captures) and the slots.
pub fn capture_packing(cu_seqlens: &[usize], captures: &[Capture]) -> (Vec<usize>, Vec<usize>) {
    if captures.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let mut caps = captures.to_vec();
    caps.sort_unstable_by_key(|c| cu_seqlens[c.seq] + c.tokens);
    let cu = std::iter::once(0).chain(caps.iter().map(|c| cu_seqlens[c.seq] + c.tokens)).collect();
    (cu, caps.iter().map(|c| c.slot).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_padded_pass_lays_out_its_tables_at_fixed_capacities() {
        let t = PackedTables::new(128, 2, 1, &Device::Cpu).unwrap();
        assert_eq!((t.chunks(), t.captures()), (4, 2));
        assert!(t.interleaved().is_none());
        // 70 tokens of slot 5 with a copy after 64 into slot 9, then 58 rows of padding in slot 3.
        let v = t.values(&[0, 70, 128], &[5, 3], &[Capture { seq: 0, tokens: 64, slot: 9 }]).unwrap();
        let part = |p| v[t.range(p)].to_vec();
        assert_eq!(part(Part::Cu), vec![0, 70, 128]);
        assert_eq!(part(Part::Slots), vec![5, 3]);
        assert_eq!(part(Part::ChunkRow), vec![0, 64, 70, 0]);
        assert_eq!(part(Part::ChunkLen), vec![64, 6, 58, 0]);
        let snap = part(Part::Snap);
        assert_eq!(snap.len(), 128);
        assert_eq!((snap[0], snap.iter().filter(|&&x| x != 0).count()), (10, 1));
        assert_eq!(part(Part::CaptureCu), vec![0, 64, 64]);
        assert_eq!(part(Part::CaptureSlot), vec![9, 0]);
        assert_eq!(v.len(), 3 + 2 + 4 + 4 + 128 + 3 + 2);
    }

    #[test]
    fn a_packing_of_another_shape_is_refused() {
        let t = PackedTables::new(64, 2, 1, &Device::Cpu).unwrap();
        let err = t.values(&[0, 30, 60], &[1, 2], &[]).unwrap_err().to_string();
        assert!(err.contains("2 sequences ending at row 64"), "{err}");
        assert!(t.values(&[0, 64], &[1], &[]).is_err());
        // A full pass with an empty padding sequence fits.
        assert!(t.values(&[0, 64, 64], &[1, 2], &[]).is_ok());
    }

    #[test]
    fn a_householder_packing_carries_its_interleaved_tables_after_its_own() {
        // Two householder steps a token: 40 tokens of slot 1, 24 rows of padding in slot 2.
        let t = PackedTables::new(64, 2, 2, &Device::Cpu).unwrap();
        let inner = t.interleaved().unwrap();
        assert_eq!((inner.rows(), inner.seqs(), inner.steps()), (128, 2, 1));
        assert_eq!(inner.range(Part::Cu).start, t.range(Part::CaptureSlot).end);
        let v = t.values(&[0, 40, 64], &[1, 2], &[]).unwrap();
        assert_eq!(v.len(), inner.range(Part::CaptureSlot).end);
        assert_eq!(v[t.range(Part::Cu)], [0, 40, 64]);
        assert_eq!(v[inner.range(Part::Cu)], [0, 80, 128]);
        assert_eq!(v[inner.range(Part::ChunkRow)], [0, 64, 80, 0]);
        assert_eq!(v[inner.range(Part::ChunkLen)], [64, 16, 48, 0]);
    }

    #[test]
    fn copies_pack_back_to_back_in_row_order() {
        let caps = [Capture { seq: 1, tokens: 64, slot: 7 }, Capture { seq: 0, tokens: 128, slot: 8 }];
        assert_eq!(capture_packing(&[0, 130, 200], &caps), (vec![0, 128, 194], vec![8, 7]));
    }
}
