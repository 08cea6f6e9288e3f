//! Attention for rows that hold several sequences end to end (packing).
//!
//! The matmuls of a layer see the packed rows as they are: no padding
//! between sequences. The attention takes each sequence apart: its tokens'
//! q/k/v are gathered into a tile of `[sequences, longest]` cells, attended
//! causally there as if each sequence had come alone, and the outputs
//! scattered back to the tokens. So no query meets another sequence's keys,
//! and the attention costs what it costs unpacked, not a packed row's
//! `row_len^2`.
//!
//! A tile pads each of its sequences to its longest, so the sequences are
//! grouped by length into several tiles ([`tile_groups`]): a sequence joins
//! a tile only if at most [`MAX_TILE_PADDING`] of its scores there fall on
//! padding; each tile is one attention call.
//!
//! A tile's cells past its sequence's end hold a copy of the sequence's
//! first token: causally only those cells' own queries see them, and their
//! outputs are never scattered back, so any finite value does (and no
//! gradient reaches the copy). A row's padding takes cell 0's output, as
//! meaningless as a padded position's output always is.

use tch::{Kind, Tensor};

/// The most of a sequence's attention scores that may fall on its tile's
/// padding (`1 - len^2 / longest^2`); a shorter sequence starts a tile.
pub const MAX_TILE_PADDING: f64 = 0.1;

/// Sequences of `lengths` grouped into tiles, longest first: each group's
/// indices, its first the longest. Every sequence of a group has at most
/// [`MAX_TILE_PADDING`] of its scores on padding.
pub fn tile_groups(lengths: &[usize]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for i in order {
        let fits = groups.last().is_some_and(|g| {
            let (n, longest) = (lengths[i] as f64, lengths[g[0]] as f64);
            1.0 - (n * n) / (longest * longest) <= MAX_TILE_PADDING
        });
        match groups.last_mut() {
            Some(g) if fits => g.push(i),
            _ => groups.push(vec![i]),
        }
    }
    groups
}

/// One attention call's sequences.
struct Tile {
    /// Each cell's token, `b * T + t` (past its sequence's end, the
    /// sequence's first token).
    gather: Tensor,
    sequences: i64,
    longest: i64,
    /// A sliding window's `[1, 1, longest, longest]` visibility; none:
    /// causal.
    window: Option<Tensor>,
}

/// The tiles of one forward's packed rows.
pub struct Tiles {
    tiles: Vec<Tile>,
    /// Each token's cell in the tiles' outputs laid end to end (for a row's
    /// padding, 0).
    scatter: Tensor,
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
    /// a sliding window's visibility of `[n]` positions, if any.
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
        let lengths: Vec<usize> = spans.iter().map(|&(_, n)| n).collect();
        let mut scatter = vec![0i64; b * t];
        let mut tiles = Vec::new();
        let mut cells_before = 0;
        for group in tile_groups(&lengths) {
            let longest = lengths[group[0]];
            let mut gather = vec![0i64; group.len() * longest];
            for (s, &seq) in group.iter().enumerate() {
                let (first, n) = spans[seq];
                let cells = &mut gather[s * longest..(s + 1) * longest];
                cells.fill(first as i64);
                for i in 0..n {
                    cells[i] = (first + i) as i64;
                    scatter[first + i] = (cells_before + s * longest + i) as i64;
                }
            }
            cells_before += group.len() * longest;
            let tile_positions = Tensor::arange(longest as i64, (Kind::Int64, tch::Device::Cpu));
            tiles.push(Tile {
                gather: Tensor::from_slice(&gather),
                sequences: group.len() as i64,
                longest: longest as i64,
                window: window(&tile_positions),
            });
        }
        Packed {
            tiles: Tiles {
                tiles,
                scatter: Tensor::from_slice(&scatter),
            },
            positions: Tensor::from_slice(&positions).view([b as i64, t as i64]),
        }
    }

    /// The same on `device`.
    pub fn into_device(self, device: tch::Device) -> Self {
        let tiles = self
            .tiles
            .tiles
            .into_iter()
            .map(|t| Tile {
                gather: t.gather.to_device(device),
                window: t.window.map(|w| w.to_device(device)),
                ..t
            })
            .collect();
        Packed {
            tiles: Tiles {
                tiles,
                scatter: self.tiles.scatter.to_device(device),
            },
            positions: self.positions.to_device(device),
        }
    }
}

impl Tiles {
    /// `q` `[B, heads, T, d]`, `k`/`v` `[B, kv_heads, T, d]` attended a
    /// sequence at a time: `[B, T, heads * d]`.
    pub fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, gqa: bool) -> Tensor {
        self.per_tile(q, |tile| {
            Tensor::scaled_dot_product_attention(
                &tile.of(q),
                &tile.of(k),
                &tile.of(v),
                tile.window.as_ref(),
                0.0,
                tile.window.is_none(),
                None,
                gqa,
            )
        })
    }

    /// What [`Tiles::attend`] does besides the attention: `q`, `k` and `v`
    /// gathered into the tiles and scattered back, side by side
    /// (`[B, T, (heads + 2 kv_heads) * d]`; a wider scatter than attend's).
    /// The step bench times it: the tiles' share of a step.
    pub fn gathers_only(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        self.per_tile(q, |tile| {
            Tensor::cat(&[tile.of(q), tile.of(k), tile.of(v)], 1)
        })
    }

    /// Each tile's `[sequences, heads, longest, d]` output of `attend`, laid
    /// end to end and scattered back to `[B, T, heads * d]` (`q`'s rows).
    fn per_tile(&self, q: &Tensor, attend: impl Fn(&Tile) -> Tensor) -> Tensor {
        let [b, _, t, _] = q.size()[..] else {
            unreachable!("q is [B, heads, T, d]")
        };
        let outs: Vec<Tensor> = self
            .tiles
            .iter()
            .map(|tile| {
                let out = attend(tile).transpose(1, 2);
                out.reshape([tile.sequences * tile.longest, -1])
            })
            .collect();
        let out = match &outs[..] {
            [one] => one.shallow_clone(),
            _ => Tensor::cat(&outs, 0),
        };
        out.index_select(0, &self.scatter).view([b, t, -1])
    }
}

impl Tile {
    /// `[B, heads, T, d]` -> `[sequences, heads, longest, d]`.
    fn of(&self, x: &Tensor) -> Tensor {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The share of a grouping's scores that fall on padding.
    fn padding(lengths: &[usize], groups: &[Vec<usize>]) -> f64 {
        let (mut real, mut all) = (0.0, 0.0);
        for g in groups {
            let longest = g.iter().map(|&i| lengths[i]).max().unwrap_or(0) as f64;
            for &i in g {
                real += (lengths[i] as f64).powi(2);
                all += longest * longest;
            }
        }
        1.0 - real / all
    }

    #[test]
    fn tiles_group_alike_lengths_and_cover_every_sequence_once() {
        let lengths = [150, 180, 40, 175, 115, 41, 178, 120];
        let groups = tile_groups(&lengths);
        let mut seen: Vec<usize> = groups.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
        for g in &groups {
            assert!(g.windows(2).all(|w| lengths[w[0]] >= lengths[w[1]]));
            assert!(padding(&lengths, std::slice::from_ref(g)) <= MAX_TILE_PADDING);
        }
        // 180, 178 and 175 share a tile; 40 and 41 another.
        assert_eq!(groups[0], [1, 6, 3]);
        assert!(groups.contains(&vec![5, 2]));
        // One tile for all would put 43% of the scores on padding.
        assert!(padding(&lengths, &[(0..8).collect()]) > 0.4);
        assert!(tile_groups(&[]).is_empty());
    }

    /// Several tiles give each sequence the attention it gets alone.
    #[test]
    fn a_row_of_unlike_lengths_attends_each_sequence_alone() {
        tch::manual_seed(7);
        let opts = (Kind::Float, tch::Device::Cpu);
        // One row: sequences of 10, 3 and 10 tokens, then 2 of padding.
        let (lens, t) = ([10usize, 3, 10], 25);
        let mut ids = vec![0i64; t];
        let mut at = 0;
        for (s, &n) in lens.iter().enumerate() {
            ids[at..at + n].fill(s as i64 + 1);
            at += n;
        }
        let packed = Packed::new(&ids, 1, t, |_| None);
        assert_eq!(packed.tiles.tiles.len(), 2, "the 10s share a tile, 3 alone");
        let (q, k, v) = (
            Tensor::randn([1, 4, t as i64, 8], opts),
            Tensor::randn([1, 2, t as i64, 8], opts),
            Tensor::randn([1, 2, t as i64, 8], opts),
        );
        let out = packed.tiles.attend(&q, &k, &v, true);
        let mut at = 0;
        for n in lens {
            let part = |x: &Tensor| x.narrow(2, at as i64, n as i64);
            let alone = Tensor::scaled_dot_product_attention(
                &part(&q),
                &part(&k),
                &part(&v),
                None::<Tensor>,
                0.0,
                true,
                None,
                true,
            )
            .transpose(1, 2)
            .reshape([1, n as i64, 32]);
            let got = out.narrow(1, at as i64, n as i64);
            let diff = (got - alone).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "sequence at {at}: {diff}");
            at += n;
        }
    }
}
