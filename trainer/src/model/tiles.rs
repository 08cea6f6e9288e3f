//! Attention for rows that hold several sequences end to end (packing).
//!
//! The matmuls of a layer see the packed rows as they are: no padding
//! between sequences. The attention takes each sequence apart: its tokens'
//! q/k/v are gathered into a `[sequences, longest]` tile, attended causally
//! there as if each sequence had come alone, and the outputs scattered back
//! to the tokens. So no query meets another sequence's keys, and the
//! attention costs what it costs unpacked (`sequences * longest^2` scores),
//! not a packed row's `row_len^2`.
//!
//! A tile's cells past its sequence's end hold a copy of the sequence's
//! first token: causally only those cells' own queries see them, and their
//! outputs are never scattered back, so any finite value does (and no
//! gradient reaches the copy). A row's padding takes tile cell 0's output,
//! as meaningless as a padded position's output always is.

use tch::{Kind, Tensor};

/// The tiles of one forward's packed rows.
pub struct Tiles {
    /// Each tile cell's token, `b * T + t` (past its sequence's end, the
    /// sequence's first token).
    gather: Tensor,
    /// Each token's tile cell, `s * longest + i` (for a row's padding, 0).
    scatter: Tensor,
    sequences: i64,
    longest: i64,
    /// A sliding window's `[1, 1, longest, longest]` visibility; none:
    /// causal.
    window: Option<Tensor>,
}

/// A packed forward's tiles and each token's position in its sequence.
pub struct Packed {
    pub tiles: Tiles,
    /// `[B, T]` i64, from 0 at each sequence's first token (and at a row's
    /// padding).
    pub positions: Tensor,
}

impl Packed {
    /// From `ids` (`[B, T]` on the CPU: 0 = padding, a row's sequences
    /// numbered in order, checked by the caller); `window(positions)` gives
    /// a sliding window's visibility of `[longest]` positions, if any.
    pub fn new(
        ids: &[i64],
        b: usize,
        t: usize,
        window: impl Fn(&Tensor) -> Option<Tensor>,
    ) -> Self {
        // (flat index of its first token, length) per sequence.
        let mut spans: Vec<(usize, usize)> = Vec::new();
        let mut positions = vec![0i64; b * t];
        for r in 0..b {
            let row = &ids[r * t..(r + 1) * t];
            let mut start = 0;
            while start < t && row[start] != 0 {
                let end = start
                    + row[start..]
                        .iter()
                        .take_while(|&&id| id == row[start])
                        .count();
                spans.push((r * t + start, end - start));
                for (p, i) in (start..end).enumerate() {
                    positions[r * t + i] = p as i64;
                }
                start = end;
            }
            // Padding: positions from 0, like a sequence of its own.
            for (p, i) in (start..t).enumerate() {
                positions[r * t + i] = p as i64;
            }
        }
        let longest = spans.iter().map(|&(_, n)| n).max().unwrap_or(1);
        let mut gather = vec![0i64; spans.len() * longest];
        let mut scatter = vec![0i64; b * t];
        for (s, &(first, n)) in spans.iter().enumerate() {
            let cells = &mut gather[s * longest..(s + 1) * longest];
            cells.fill(first as i64);
            for i in 0..n {
                cells[i] = (first + i) as i64;
                scatter[first + i] = (s * longest + i) as i64;
            }
        }
        let tile_positions = Tensor::arange(longest as i64, (Kind::Int64, tch::Device::Cpu));
        Packed {
            tiles: Tiles {
                gather: Tensor::from_slice(&gather),
                scatter: Tensor::from_slice(&scatter),
                sequences: spans.len() as i64,
                longest: longest as i64,
                window: window(&tile_positions),
            },
            positions: Tensor::from_slice(&positions).view([b as i64, t as i64]),
        }
    }

    /// The same on `device`.
    pub fn into_device(self, device: tch::Device) -> Self {
        let t = self.tiles;
        Packed {
            tiles: Tiles {
                gather: t.gather.to_device(device),
                scatter: t.scatter.to_device(device),
                window: t.window.map(|w| w.to_device(device)),
                ..t
            },
            positions: self.positions.to_device(device),
        }
    }
}

impl Tiles {
    /// `q` `[B, heads, T, d]`, `k`/`v` `[B, kv_heads, T, d]` attended a
    /// sequence at a time: `[B, T, heads * d]`.
    pub fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, gqa: bool) -> Tensor {
        let [b, heads, t, d] = q.size()[..] else {
            unreachable!("q is [B, heads, T, d]")
        };
        let out = Tensor::scaled_dot_product_attention(
            &self.tile(q),
            &self.tile(k),
            &self.tile(v),
            self.window.as_ref(),
            0.0,
            self.window.is_none(),
            None,
            gqa,
        );
        let cells = self.sequences * self.longest;
        out.transpose(1, 2)
            .reshape([cells, heads * d])
            .index_select(0, &self.scatter)
            .view([b, t, heads * d])
    }

    /// `[B, heads, T, d]` -> `[sequences, heads, longest, d]`.
    fn tile(&self, x: &Tensor) -> Tensor {
        let [b, heads, t, d] = x.size()[..] else {
            unreachable!("x is [B, heads, T, d]")
        };
        x.transpose(1, 2)
            .reshape([b * t, heads * d])
            .index_select(0, &self.gather)
            .view([self.sequences, self.longest, heads, d])
            .transpose(1, 2)
    }
}
