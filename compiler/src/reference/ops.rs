//! The math of every op, written for clarity: f32 values, f64 accumulation in reductions.

use super::tensor::{Data, Tensor};
use crate::ir::{verify::broadcast, Shape};

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// torch's softplus (beta 1, threshold 20).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (x as f64).exp().ln_1p() as f32
    }
}

pub fn unary(x: &Tensor, f: impl Fn(f32) -> f32) -> Tensor {
    Tensor::f32(x.dims(), x.f().iter().map(|v| f(*v)).collect())
}

/// Elementwise binary op with numpy broadcasting.
pub fn binary(a: &Tensor, b: &Tensor, f: impl Fn(f32, f32) -> f32) -> Tensor {
    let out = broadcast(&a.shape, &b.shape).expect("verified shapes broadcast");
    let idx = |s: &Shape, o: &[usize]| -> usize {
        // Index into `s` of the output coordinate `o` (aligned right, size-1 dims repeat).
        let off = o.len() - s.rank();
        let mut i = 0;
        for (d, &n) in s.dims().iter().enumerate() {
            i = i * n + if n == 1 { 0 } else { o[off + d] };
        }
        i
    };
    let mut coord = vec![0usize; out.rank()];
    let mut data = Vec::with_capacity(out.numel());
    for _ in 0..out.numel() {
        data.push(f(
            a.f()[idx(&a.shape, &coord)],
            b.f()[idx(&b.shape, &coord)],
        ));
        for d in (0..coord.len()).rev() {
            coord[d] += 1;
            if coord[d] < out.dims()[d] {
                break;
            }
            coord[d] = 0;
        }
    }
    Tensor::f32(out.dims(), data)
}

/// Applies `f` to every row (innermost axis) of `x`, producing rows of the same length.
fn rows(x: &Tensor, mut f: impl FnMut(usize, &[f32], &mut [f32])) -> Tensor {
    let n = x.shape.last();
    let mut out = vec![0.0; x.shape.numel()];
    for (r, (src, dst)) in x.f().chunks(n).zip(out.chunks_mut(n)).enumerate() {
        f(r, src, dst);
    }
    Tensor::f32(x.dims(), out)
}

fn inv_rms(row: &[f32], eps: f32) -> f64 {
    let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / row.len() as f64;
    1.0 / (ms + eps as f64).sqrt()
}

pub fn rms_norm(x: &Tensor, w: &[f32], eps: f32, zero_centered: bool) -> Tensor {
    rows(x, |_, src, dst| {
        let s = inv_rms(src, eps);
        for i in 0..src.len() {
            let w = if zero_centered {
                1.0 + w[i] as f64
            } else {
                w[i] as f64
            };
            dst[i] = (src[i] as f64 * s * w) as f32;
        }
    })
}

pub fn gated_rms_norm(x: &Tensor, z: &[f32], w: &[f32], eps: f32) -> Tensor {
    let n = x.shape.last();
    rows(x, |r, src, dst| {
        let s = inv_rms(src, eps);
        for i in 0..n {
            dst[i] = (src[i] as f64 * s * w[i] as f64 * silu(z[r * n + i]) as f64) as f32;
        }
    })
}

pub fn l2_norm(x: &Tensor, eps: f32) -> Tensor {
    rows(x, |_, src, dst| {
        let s = 1.0 / (src.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() + eps as f64).sqrt();
        for i in 0..src.len() {
            dst[i] = (src[i] as f64 * s) as f32;
        }
    })
}

pub fn softmax(x: &Tensor) -> Tensor {
    rows(x, |_, src, dst| {
        let m = src.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b)) as f64;
        let e: Vec<f64> = src.iter().map(|v| (*v as f64 - m).exp()).collect();
        let s: f64 = e.iter().sum();
        for i in 0..src.len() {
            dst[i] = (e[i] / s) as f32;
        }
    })
}

/// `w[o, i] · x[i]`.
pub fn matvec(w: &[f32], rows_: usize, x: &[f32]) -> Vec<f32> {
    let n = x.len();
    (0..rows_)
        .map(|o| dot(&w[o * n..(o + 1) * n], x) as f32)
        .collect()
}

pub fn expert_matvec(w: &Tensor, idx: &[i32], x: &Tensor) -> Tensor {
    let (e, o, i) = (w.dims()[0], w.dims()[1], w.dims()[2]);
    let mut out = Vec::with_capacity(idx.len() * o);
    for (j, &ex) in idx.iter().enumerate() {
        let ex = (ex.max(0) as usize).min(e - 1);
        let xin = if x.shape.rank() == 1 {
            x.f()
        } else {
            &x.f()[j * i..(j + 1) * i]
        };
        out.extend(matvec(&w.f()[ex * o * i..(ex + 1) * o * i], o, xin));
    }
    Tensor::f32(&[idx.len(), o], out)
}

/// Rotate-half RoPE on the first `rot` dims of each head, angle = f32(inv_freq · pos).
pub fn rope(x: &Tensor, pos: i32, theta: f32, rot: usize) -> Tensor {
    let half = rot / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / rot as f32))
        .collect();
    rows(x, |_, src, dst| {
        dst.copy_from_slice(src);
        for i in 0..half {
            let angle = inv_freq[i] * pos as f32;
            let (s, c) = (angle as f64).sin_cos();
            let (a, b) = (src[i] as f64, src[i + half] as f64);
            dst[i] = (a * c - b * s) as f32;
            dst[i + half] = (b * c + a * s) as f32;
        }
    })
}

fn pick<T: Copy>(
    v: &[T],
    outer: usize,
    len: usize,
    start: usize,
    end: usize,
    inner: usize,
) -> Vec<T> {
    let mut out = Vec::with_capacity(outer * (end - start) * inner);
    for o in 0..outer {
        let base = o * len * inner;
        out.extend_from_slice(&v[base + start * inner..base + end * inner]);
    }
    out
}

pub fn slice(x: &Tensor, axis: usize, start: usize, end: usize) -> Tensor {
    let d = x.dims();
    let outer: usize = d[..axis].iter().product();
    let inner: usize = d[axis + 1..].iter().product();
    let mut dims = d.to_vec();
    dims[axis] = end - start;
    match &x.data {
        Data::F32(v) => Tensor::f32(&dims, pick(v, outer, d[axis], start, end, inner)),
        Data::I32(v) => Tensor::i32(&dims, pick(v, outer, d[axis], start, end, inner)),
    }
}

fn join<T: Copy>(va: &[T], vb: &[T], outer: usize, na: usize, nb: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(va.len() + vb.len());
    for o in 0..outer {
        out.extend_from_slice(&va[o * na..(o + 1) * na]);
        out.extend_from_slice(&vb[o * nb..(o + 1) * nb]);
    }
    out
}

pub fn concat(a: &Tensor, b: &Tensor, axis: usize) -> Tensor {
    let (da, db) = (a.dims(), b.dims());
    let outer: usize = da[..axis].iter().product();
    let inner: usize = da[axis + 1..].iter().product();
    let (na, nb) = (da[axis] * inner, db[axis] * inner);
    let mut dims = da.to_vec();
    dims[axis] += db[axis];
    match (&a.data, &b.data) {
        (Data::I32(x), Data::I32(y)) => Tensor::i32(&dims, join(x, y, outer, na, nb)),
        _ => Tensor::f32(&dims, join(a.f(), b.f(), outer, na, nb)),
    }
}

/// Decode attention of q[hq, d] over cache slots 0..=pos of k/v[hkv, capacity, d].
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, pos: usize, scale: f32) -> Tensor {
    let (hq, d) = (q.dims()[0], q.dims()[1]);
    let (hkv, cap) = (k.dims()[0], k.dims()[1]);
    let group = hq / hkv;
    let mut out = vec![0.0; hq * d];
    for h in 0..hq {
        let kh = h / group;
        let qh = &q.f()[h * d..(h + 1) * d];
        let scores: Vec<f64> = (0..=pos)
            .map(|j| dot(qh, &k.f()[(kh * cap + j) * d..(kh * cap + j + 1) * d]) * scale as f64)
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let total: f64 = e.iter().sum();
        for c in 0..d {
            let acc: f64 = (0..=pos)
                .map(|j| e[j] * v.f()[(kh * cap + j) * d + c] as f64)
                .sum();
            out[h * d + c] = (acc / total) as f32;
        }
    }
    Tensor::f32(&[hq, d], out)
}

/// Depthwise conv over the window [state | x] (oldest first) with w[c, K].
pub fn causal_conv1d(state: &Tensor, x: &[f32], w: &[f32]) -> Tensor {
    let (c, km1) = (state.dims()[0], state.dims()[1]);
    let k = km1 + 1;
    let out = (0..c)
        .map(|ch| {
            let mut acc = w[ch * k + km1] as f64 * x[ch] as f64;
            for j in 0..km1 {
                acc += w[ch * k + j] as f64 * state.f()[ch * km1 + j] as f64;
            }
            acc as f32
        })
        .collect();
    Tensor::f32(&[c], out)
}

pub fn conv_shift(state: &Tensor, x: &[f32]) -> Tensor {
    let (c, km1) = (state.dims()[0], state.dims()[1]);
    let mut out = vec![0.0; c * km1];
    for ch in 0..c {
        for j in 0..km1 {
            out[ch * km1 + j] = if j + 1 < km1 {
                state.f()[ch * km1 + j + 1]
            } else {
                x[ch]
            };
        }
    }
    Tensor::f32(&[c, km1], out)
}

/// s' = s·exp(g); s'' = s' + k ⊗ beta·(v − s'ᵀk), per value head.
pub fn delta_rule_update(s: &Tensor, k: &Tensor, v: &[f32], g: &[f32], beta: &[f32]) -> Tensor {
    let (hv, dk, dv) = (s.dims()[0], s.dims()[1], s.dims()[2]);
    let group = hv / k.dims()[0];
    let mut out = s.f().to_vec();
    for h in 0..hv {
        let kh = &k.f()[(h / group) * dk..(h / group + 1) * dk];
        let st = &mut out[h * dk * dv..(h + 1) * dk * dv];
        let decay = (g[h] as f64).exp();
        for x in st.iter_mut() {
            *x = (*x as f64 * decay) as f32;
        }
        for j in 0..dv {
            let mem: f64 = (0..dk).map(|i| st[i * dv + j] as f64 * kh[i] as f64).sum();
            let delta = (v[h * dv + j] as f64 - mem) * beta[h] as f64;
            for i in 0..dk {
                st[i * dv + j] = (st[i * dv + j] as f64 + kh[i] as f64 * delta) as f32;
            }
        }
    }
    Tensor::f32(s.dims(), out)
}

pub fn delta_rule_readout(s: &Tensor, q: &Tensor, scale: f32) -> Tensor {
    let (hv, dk, dv) = (s.dims()[0], s.dims()[1], s.dims()[2]);
    let group = hv / q.dims()[0];
    let mut out = vec![0.0; hv * dv];
    for h in 0..hv {
        let qh = &q.f()[(h / group) * dk..(h / group + 1) * dk];
        for j in 0..dv {
            let acc: f64 = (0..dk)
                .map(|i| s.f()[(h * dk + i) * dv + j] as f64 * qh[i] as f64)
                .sum();
            out[h * dv + j] = (acc * scale as f64) as f32;
        }
    }
    Tensor::f32(&[hv, dv], out)
}

/// Indices of the k largest values, largest first, ties to the lower index.
pub fn top_k(x: &[f32], k: usize) -> Vec<i32> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
    idx.into_iter().take(k).map(|i| i as i32).collect()
}

pub fn sum(x: &Tensor, axis: usize) -> Tensor {
    let d = x.dims();
    let outer: usize = d[..axis].iter().product();
    let inner: usize = d[axis + 1..].iter().product();
    let mut out = vec![0.0f64; outer * inner];
    for o in 0..outer {
        for a in 0..d[axis] {
            for i in 0..inner {
                out[o * inner + i] += x.f()[(o * d[axis] + a) * inner + i] as f64;
            }
        }
    }
    let mut dims = d.to_vec();
    dims.remove(axis);
    if dims.is_empty() {
        dims.push(1);
    }
    Tensor::f32(&dims, out.into_iter().map(|v| v as f32).collect())
}
