//! Weight pages: a schedule's weights buffer cut into buffers no larger than the device makes
//! one. The compiler stores every weight in one buffer; NVIDIA's drivers make buffers of at
//! most about 4 GiB (`maxMemoryAllocationSize`), so a model of more weight bytes than that
//! (Qwen3-8B in bf16, or any model of a few billion parameters) could not load. At load the
//! runtime moves the weights into as many buffers as it takes, each at most the device's limit.
//!
//! The cut never splits what one binding reads or one upload writes: the buffer's bound and
//! uploaded ranges are merged where they overlap into pieces (a tensor, an expert stack, the
//! packed q/k/v of a layer), and pages are cut between pieces only, and only where a piece
//! starts on [`PAGE_ALIGN`] bytes (the compiler aligns each allocation), so that every slice,
//! moved to its piece's page with its offset less the page's start, keeps its alignment for the
//! device's `minStorageBufferOffsetAlignment` (at most 256 under Vulkan). A pure
//! rewrite of the schedule, as persistent regions are, so that every executor runs the result
//! as it runs any schedule.

use super::{BufferDecl, BufferId, BufferRole, Schedule, Slice};

/// Where a page may start: the most `minStorageBufferOffsetAlignment` Vulkan allows.
pub const PAGE_ALIGN: u64 = 256;

/// A piece bigger than one page may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PieceTooLarge {
    /// The tensors uploaded into the piece, in upload order.
    pub tensors: Vec<String>,
    /// Its bytes.
    pub bytes: u64,
    /// The most one buffer may hold.
    pub limit: u64,
}

impl Schedule {
    /// The schedule with each weights buffer larger than `limit` bytes cut into pages of at
    /// most `limit` bytes: the first stays where it was, the others are appended to
    /// [`Schedule::buffers`]. A schedule whose weights fit is returned as it is. Fails where
    /// one piece alone (what one binding reads) exceeds `limit`.
    pub fn with_weight_pages(mut self, limit: u64) -> Result<Schedule, PieceTooLarge> {
        for b in 0..self.buffers.len() {
            let decl = &self.buffers[b];
            if decl.role == BufferRole::Weights && decl.size > limit {
                self.page(BufferId(b as u32), limit)?;
            }
        }
        Ok(self)
    }

    /// Every slice of the schedule in `buffer`, mutably.
    fn slices_in(&mut self, buffer: BufferId) -> impl Iterator<Item = &mut Slice> {
        let uploads = self.weights.iter_mut().map(|w| &mut w.dst);
        let bound = self
            .dispatches
            .iter_mut()
            .chain(self.persistent.iter_mut().map(|r| &mut r.dispatch))
            .flat_map(|d| d.bindings.iter_mut());
        uploads.chain(bound).filter(move |s| s.buffer == buffer)
    }

    fn page(&mut self, buffer: BufferId, limit: u64) -> Result<(), PieceTooLarge> {
        let pieces = pieces(
            self.slices_in(buffer)
                .map(|s| (s.offset, s.offset + s.size)),
        );
        // Pages as [start, end) of the old buffer, cut between pieces.
        let mut pages: Vec<(u64, u64)> = vec![];
        for (start, end) in pieces {
            if end - start > limit {
                let tensors = self
                    .weights
                    .iter()
                    .filter(|w| w.dst.buffer == buffer)
                    .filter(|w| w.dst.offset < end && start < w.dst.offset + w.dst.size)
                    .map(|w| w.tensor.clone())
                    .collect();
                return Err(PieceTooLarge {
                    tensors,
                    bytes: end - start,
                    limit,
                });
            }
            match pages.last_mut() {
                Some((first, last)) if end - *first <= limit => *last = end,
                // The first page keeps the buffer, from offset 0.
                None => pages.push((0, end)),
                Some(_) => pages.push((start, end)),
            }
        }
        if pages.len() <= 1 {
            return Ok(());
        }
        // The first page keeps the buffer (from offset 0); the others are appended.
        let label = self.buffers[buffer.index()].label.clone();
        let first_new = self.buffers.len();
        self.buffers[buffer.index()].size = pages[0].1;
        for (i, &(start, end)) in pages.iter().enumerate().skip(1) {
            self.buffers.push(BufferDecl {
                label: format!("{label} (page {} of {})", i + 1, pages.len()),
                size: end - start,
                role: BufferRole::Weights,
            });
        }
        let starts: Vec<u64> = pages.iter().map(|p| p.0).collect();
        for s in self.slices_in(buffer) {
            // Every slice lies in one piece, so in the page that holds its start.
            let i = starts.partition_point(|&p| p <= s.offset).max(1) - 1;
            if i > 0 {
                s.buffer = BufferId((first_new + i - 1) as u32);
                s.offset -= starts[i];
            }
        }
        Ok(())
    }
}

/// The ranges `[start, end)` merged where they overlap, in ascending order, and each that
/// starts off [`PAGE_ALIGN`] joined to the one before (it cannot start a page); ranges that
/// only touch stay apart otherwise: a page may be cut between them.
fn pieces(ranges: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut r: Vec<(u64, u64)> = ranges.filter(|(s, e)| e > s).collect();
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(r.len());
    for (s, e) in r {
        match out.last_mut() {
            Some((_, last)) if s < *last || s % PAGE_ALIGN != 0 => *last = (*last).max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{Dispatch, Io, KernelId, ModelMeta, TokenEncoding, WeightUpload};
    use super::*;
    use proptest::prelude::*;

    fn slice(buffer: u32, offset: u64, size: u64) -> Slice {
        Slice {
            buffer: BufferId(buffer),
            offset,
            size,
        }
    }

    fn dispatch(bindings: Vec<Slice>) -> Dispatch {
        Dispatch {
            kernel: KernelId(0),
            bindings,
            push_constants: vec![],
            workgroups: [1, 1, 1],
            label: String::new(),
            alternatives: vec![],
            ops: vec![],
        }
    }

    /// A schedule of one weights buffer of `size` (buffer 0) and an arena (buffer 1), its
    /// tensors uploaded at `uploads` and read by one dispatch per binding group.
    fn schedule(size: u64, uploads: &[(u64, u64)], groups: &[Vec<(u64, u64)>]) -> Schedule {
        let decl = |label: &str, size, role| BufferDecl {
            label: label.into(),
            size,
            role,
        };
        let io = slice(1, 0, 4);
        Schedule {
            meta: ModelMeta::for_tests(),
            buffers: vec![
                decl("weights", size, BufferRole::Weights),
                decl("arena", 4096, BufferRole::Arena),
            ],
            weights: uploads
                .iter()
                .enumerate()
                .map(|(i, &(o, s))| WeightUpload {
                    tensor: format!("t{i}"),
                    dst: slice(0, o, s),
                })
                .collect(),
            kernels: vec![],
            dispatches: groups
                .iter()
                .map(|g| {
                    let mut b: Vec<Slice> = g.iter().map(|&(o, s)| slice(0, o, s)).collect();
                    b.push(io);
                    dispatch(b)
                })
                .collect(),
            levels: vec![],
            io: Io {
                token: io,
                token_encoding: TokenEncoding::Index,
                position: io,
                logits: io,
            },
            persistent: vec![],
        }
    }

    #[test]
    fn a_schedule_whose_weights_fit_is_left_as_it_is() {
        let s = schedule(8192, &[(0, 4096), (4096, 4096)], &[vec![(0, 8192)]]);
        assert_eq!(s.clone().with_weight_pages(8192).unwrap(), s);
    }

    #[test]
    fn pages_are_cut_between_pieces_and_slices_follow_them() {
        // t0 and t1 packed (one binding reads both), t2 alone, t3 alone.
        let uploads = [(0, 4096), (4096, 4096), (8192, 8192), (16384, 4096)];
        let groups = [
            vec![(0, 8192)],
            vec![(8192, 8192), (16384, 4096)],
            vec![(4096, 2048)],
        ];
        let s = schedule(20480, &uploads, &groups)
            .with_weight_pages(12288)
            .unwrap();
        // Pages: [0, 8192) (t2 would pass 12288), [8192, 20480).
        assert_eq!(s.buffers.len(), 3);
        assert_eq!(s.buffers[0].size, 8192);
        assert_eq!(s.buffers[2].size, 12288);
        assert_eq!(s.buffers[2].role, BufferRole::Weights);
        assert_eq!(s.buffers[2].label, "weights (page 2 of 2)");
        let dst: Vec<Slice> = s.weights.iter().map(|w| w.dst).collect();
        assert_eq!(
            dst,
            [
                slice(0, 0, 4096),
                slice(0, 4096, 4096),
                slice(2, 0, 8192),
                slice(2, 8192, 4096)
            ]
        );
        assert_eq!(s.dispatches[1].bindings[0], slice(2, 0, 8192));
        assert_eq!(s.dispatches[1].bindings[1], slice(2, 8192, 4096));
        // A slice inside a piece, and the arena's binding, unmoved.
        assert_eq!(s.dispatches[2].bindings[0], slice(0, 4096, 2048));
        assert_eq!(s.dispatches[2].bindings[1], slice(1, 0, 4));
    }

    #[test]
    fn a_piece_larger_than_a_page_names_its_tensors() {
        let uploads = [(0, 4096), (4096, 4096), (8192, 4096)];
        let err = schedule(12288, &uploads, &[vec![(0, 8192)]])
            .with_weight_pages(4096)
            .unwrap_err();
        assert_eq!(err.tensors, ["t0", "t1"]);
        assert_eq!((err.bytes, err.limit), (8192, 4096));
    }

    proptest! {
        /// Any tensors, packed into bindings at random and paged at any limit a piece fits:
        /// every slice lies inside its page, no page passes the limit, and every slice reads
        /// the bytes it read before (each byte of the old buffer has one place in the pages).
        #[test]
        fn every_slice_reads_what_it_read_before(
            sizes in proptest::collection::vec(1u64..64, 1..40),
            packs in proptest::collection::vec(1usize..4, 1..40),
            subs in proptest::collection::vec((0u64..64, 1u64..64), 0..20),
            spans in proptest::collection::vec((0usize..40, 0u64..64, 1u64..64), 0..4),
            limit_extra in 0u64..300,
        ) {
            // Tensors back to back, 64-byte aligned (a quarter of them on a page's alignment),
            // each group of `packs` consecutive tensors bound together.
            let mut uploads = vec![];
            let mut at = 0u64;
            for s in &sizes {
                uploads.push((at, s * 64));
                at += s * 64;
            }
            let mut groups = vec![];
            let mut i = 0;
            for p in packs.iter().cycle() {
                if i >= uploads.len() {
                    break;
                }
                let j = (i + p).min(uploads.len());
                let (start, end) = (uploads[i].0, uploads[j - 1].0 + uploads[j - 1].1);
                groups.push(vec![(start, end - start)]);
                i = j;
            }
            // Some bindings inside a group (a prefetch cut to its budget, a norm weight).
            let whole = groups.len();
            for (k, (off, len)) in subs.iter().enumerate() {
                let (gs, gl) = groups[k % whole][0];
                let off = off % gl;
                groups.push(vec![(gs + off, (*len).min(gl - off).max(1))]);
            }
            // A few bindings from inside one group into the next (their two groups become one
            // piece).
            for (k, from, to) in spans {
                if whole < 2 {
                    break;
                }
                let k = k % (whole - 1);
                let ((a, al), (b, bl)) = (groups[k][0], groups[k + 1][0]);
                let start = a + from % al;
                let end = b + (to % bl).max(1);
                groups.push(vec![(start, end - start)]);
            }
            // The limit at least the biggest piece.
            let pieces = pieces(groups.iter().map(|g| (g[0].0, g[0].0 + g[0].1)));
            let biggest = pieces.iter().map(|(s, e)| e - s).max().unwrap();
            let limit = biggest + limit_extra * 64;
            let before = schedule(at, &uploads, &groups);
            let after = before.clone().with_weight_pages(limit).unwrap();
            // Where old byte b of buffer 0 went.
            let mut place = std::collections::HashMap::new();
            let old: Vec<Slice> = before.weights.iter().map(|w| w.dst)
                .chain(before.dispatches.iter().flat_map(|d| d.bindings.clone()))
                .collect();
            let new: Vec<Slice> = after.weights.iter().map(|w| w.dst)
                .chain(after.dispatches.iter().flat_map(|d| d.bindings.clone()))
                .collect();
            for (o, n) in old.iter().zip(&new) {
                prop_assert_eq!(o.size, n.size);
                if o.buffer != BufferId(0) {
                    prop_assert_eq!(o, n);
                    continue;
                }
                let page = &after.buffers[n.buffer.index()];
                prop_assert_eq!(page.role, BufferRole::Weights);
                prop_assert!(n.offset + n.size <= page.size, "{:?} past its page", n);
                // Alignment kept: an offset moves by a multiple of PAGE_ALIGN.
                prop_assert_eq!(n.offset % PAGE_ALIGN, o.offset % PAGE_ALIGN);
                for b in 0..o.size {
                    let to = (n.buffer, n.offset + b);
                    prop_assert_eq!(*place.entry(o.offset + b).or_insert(to), to);
                }
            }
            for b in &after.buffers {
                if b.role == BufferRole::Weights {
                    prop_assert!(b.size <= limit, "{} > {}", b.size, limit);
                }
            }
            // No two old bytes share a new place.
            let mut seen = std::collections::HashSet::new();
            for to in place.values() {
                prop_assert!(seen.insert(*to));
            }
        }
    }
}
