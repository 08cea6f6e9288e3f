//! agl's AdamW against `torch.optim.AdamW` (a Python run on the same
//! tensors, expected bit for bit: same libtorch, same ops) and against tch's
//! C++ `nn::AdamW` (close, and the step times printed side by side).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::common::venv_python;
use agl_rl::{AdamW, AdamWConfig};
use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};

/// Test data from a local generator (tch's RNG is global across tests).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[-scale, scale]`.
    fn tensor(&mut self, shape: &[i64], scale: f64) -> Tensor {
        let n: i64 = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| ((self.next() * 2.0 - 1.0) * scale) as f32)
            .collect();
        Tensor::from_slice(&v).view(shape)
    }
}

/// Makes `g` the gradient of leaf `p` (exactly: d/dp sum(p * g) = g).
fn set_grad(p: &Tensor, g: &Tensor) {
    let mut old = p.grad();
    if old.defined() {
        let _ = old.zero_();
    }
    (p * g).sum(Kind::Float).backward();
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    f64::try_from((a - b).abs().max()).unwrap()
}

fn get<'a>(tensors: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    &tensors.iter().find(|(n, _)| n == name).unwrap().1
}

const CONFIG: AdamWConfig = AdamWConfig {
    beta1: 0.9,
    beta2: 0.95,
    weight_decay: 0.1,
    eps: 1e-8,
};
const LRS: [f64; 5] = [1e-3, 2e-3, 3e-3, 3e-3, 5e-4];

#[test]
fn matches_torch_optim_adamw_bit_for_bit() {
    // Odd sizes exercise the vectorised kernels' tails; gradient scales from
    // 1e-7 (where eps matters) to 10.
    let specs: [(&str, &[i64], f64); 4] = [
        ("a.weight", &[7, 5], 1.0),
        ("b.bias", &[13], 1e-7),
        ("c.big", &[4099], 10.0),
        ("d.cube", &[3, 4, 2], 1e-3),
    ];
    let rng = &mut Rng(11);
    let mut input: Vec<(String, Tensor)> = Vec::new();
    let mut params = Vec::new();
    for (name, shape, _) in specs {
        let p = rng.tensor(shape, 0.5);
        input.push((format!("param.{name}"), p.copy()));
        params.push((name.to_string(), p.set_requires_grad(true)));
    }
    for k in 0..LRS.len() {
        for (name, shape, scale) in specs {
            input.push((format!("grad.{k}.{name}"), rng.tensor(shape, scale)));
        }
    }
    input.push(("lr".into(), Tensor::from_slice(&LRS)));
    let c = CONFIG;
    let hyper = [c.beta1, c.beta2, c.weight_decay, c.eps];
    input.push(("hyper".into(), Tensor::from_slice(&hyper)));

    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("adamw_parity");
    std::fs::create_dir_all(&dir).unwrap();
    let (src, dst) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
    Tensor::write_safetensors(&input, &src).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/parity/adamw_reference.py");
    let status = Command::new(venv_python())
        .args([&script, &src, &dst])
        .status()
        .unwrap();
    assert!(status.success(), "{} failed: {status}", script.display());
    let reference = Tensor::read_safetensors(&dst).unwrap();

    let mut opt = AdamW::new(
        params
            .iter()
            .map(|(n, p)| (n.clone(), p.shallow_clone()))
            .collect(),
        c,
    )
    .unwrap();
    let mut worst: f64 = 0.0;
    for (k, &lr) in LRS.iter().enumerate() {
        for (name, p) in &params {
            set_grad(p, get(&input, &format!("grad.{k}.{name}")));
        }
        opt.step(lr).unwrap();
        for (name, p) in &params {
            let d = max_abs_diff(&p.detach(), get(&reference, &format!("param.{k}.{name}")));
            println!("step {k} {name}: max |agl - torch| = {d:e}");
            worst = worst.max(d);
        }
    }
    let state = opt.state_tensors();
    for (name, _) in &params {
        for key in ["exp_avg", "exp_avg_sq"] {
            let key = format!("{key}.{name}");
            let d = max_abs_diff(get(&state, &key), get(&reference, &key));
            println!("{key}: max |agl - torch| = {d:e}");
            worst = worst.max(d);
        }
        assert_eq!(
            i64::try_from(get(&state, &format!("step.{name}"))).unwrap(),
            5
        );
    }
    // The updates are about lr in size: a zero difference is not trivial.
    assert!(max_abs_diff(&params[0].1.detach(), get(&input, "param.a.weight")) > 1e-3);
    assert_eq!(worst, 0.0, "agl's AdamW differs from torch.optim.AdamW");
}

/// A fresh var store holding copies of `values` under `w<i>`.
fn var_store(values: &[Tensor]) -> nn::VarStore {
    let vs = nn::VarStore::new(Device::Cpu);
    for (i, v) in values.iter().enumerate() {
        let _ = vs.root().var_copy(&format!("w{i}"), v);
    }
    vs
}

fn sorted_vars(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut vars: Vec<_> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

#[test]
fn close_to_tch_adamw_and_about_as_fast() {
    // About 4M parameters, so the step time is the kernels', not overhead.
    // Both optimizers see the same tensors, so tch's (global) RNG will do.
    let uniform =
        |s: &[i64], scale: f64| (Tensor::rand(s, (Kind::Float, Device::Cpu)) * 2.0 - 1.0) * scale;
    let shapes: [&[i64]; 4] = [&[1024, 1024], &[1024, 1024], &[2048, 1024], &[1000]];
    let init: Vec<Tensor> = shapes.iter().map(|s| uniform(s, 0.5)).collect();
    let (vs_tch, vs_agl) = (var_store(&init), var_store(&init));
    let c = CONFIG;
    let mut tch_opt = nn::AdamW {
        beta1: c.beta1,
        beta2: c.beta2,
        wd: c.weight_decay,
        eps: c.eps,
        amsgrad: false,
    }
    .build(&vs_tch, LRS[0])
    .unwrap();
    let mut agl_opt = AdamW::new(sorted_vars(&vs_agl), c).unwrap();
    let (mut t_tch, mut t_agl) = (0.0, 0.0);
    for &lr in &LRS {
        // In name order, as the sorted variables w0..w3.
        let grads: Vec<Tensor> = shapes.iter().map(|s| uniform(s, 1.0)).collect();
        for (g, ((_, a), (_, b))) in grads
            .iter()
            .zip(sorted_vars(&vs_tch).iter().zip(sorted_vars(&vs_agl)))
        {
            set_grad(a, g);
            set_grad(&b, g);
        }
        tch_opt.set_lr(lr);
        let start = Instant::now();
        tch_opt.step();
        t_tch += start.elapsed().as_secs_f64();
        let start = Instant::now();
        agl_opt.step(lr).unwrap();
        t_agl += start.elapsed().as_secs_f64();
    }
    let mut worst: f64 = 0.0;
    for ((name, a), (_, b)) in sorted_vars(&vs_tch).iter().zip(sorted_vars(&vs_agl)) {
        let d = max_abs_diff(a, &b);
        println!("{name}: max |agl - tch| = {d:e}");
        worst = worst.max(d);
    }
    let n = LRS.len() as f64;
    println!(
        "AdamW step over {} parameters: agl {:.2} ms, tch nn::AdamW {:.2} ms (mean of {n})",
        init.iter().map(Tensor::numel).sum::<usize>(),
        1e3 * t_agl / n,
        1e3 * t_tch / n
    );
    // tch's C++ AdamW updates m as `m * b1 + (1 - b1) * g` where PyTorch
    // (and agl) lerp: rounding-level differences on updates of about lr.
    assert!(worst < 1e-6, "agl vs tch AdamW: {worst:e}");
}

#[test]
fn bf16_parameters_are_updated_in_f32_and_rounded() {
    let rng = &mut Rng(9);
    let init = rng
        .tensor(&[64, 33], 0.5)
        .to_kind(Kind::BFloat16)
        .to_kind(Kind::Float);
    let p32 = init.copy().set_requires_grad(true);
    let p16 = init.to_kind(Kind::BFloat16).set_requires_grad(true);
    let mut opt32 = AdamW::new(vec![("p".into(), p32.shallow_clone())], CONFIG).unwrap();
    let mut opt16 = AdamW::new(vec![("p".into(), p16.shallow_clone())], CONFIG).unwrap();
    // One step from the same bf16-representable start and gradient: the
    // bf16 result is the f32 result rounded to bf16.
    let g = rng
        .tensor(&[64, 33], 1.0)
        .to_kind(Kind::BFloat16)
        .to_kind(Kind::Float);
    set_grad(&p32, &g);
    set_grad(&p16, &g.to_kind(Kind::BFloat16));
    opt32.step(1e-2).unwrap();
    opt16.step(1e-2).unwrap();
    assert_eq!(p16.kind(), Kind::BFloat16);
    let expected = p32.detach().to_kind(Kind::BFloat16).to_kind(Kind::Float);
    assert_eq!(
        max_abs_diff(&p16.detach().to_kind(Kind::Float), &expected),
        0.0
    );
    assert!(max_abs_diff(&p16.detach().to_kind(Kind::Float), &init) > 1e-3);
    assert_eq!(get(&opt16.state_tensors(), "exp_avg.p").kind(), Kind::Float);
}

#[test]
fn a_wrong_state_is_refused_and_changes_nothing() {
    let rng = &mut Rng(3);
    let p = rng.tensor(&[4, 3], 1.0).set_requires_grad(true);
    let mut opt = AdamW::new(vec![("p".into(), p.shallow_clone())], CONFIG).unwrap();
    set_grad(&p, &rng.tensor(&[4, 3], 1.0));
    opt.step(1e-3).unwrap();
    let before = opt
        .state_tensors()
        .iter()
        .map(|(n, t)| (n.clone(), t.copy()))
        .collect::<Vec<_>>();
    let bad_shape = vec![
        (
            "exp_avg.p".to_string(),
            Tensor::zeros([3, 4], (Kind::Float, Device::Cpu)),
        ),
        (
            "exp_avg_sq.p".to_string(),
            Tensor::zeros([4, 3], (Kind::Float, Device::Cpu)),
        ),
        ("step.p".to_string(), Tensor::from(7i64)),
    ];
    let missing = vec![(
        "exp_avg.p".to_string(),
        Tensor::zeros([4, 3], (Kind::Float, Device::Cpu)),
    )];
    let mut extra: Vec<(String, Tensor)> =
        before.iter().map(|(n, t)| (n.clone(), t.copy())).collect();
    extra.push((
        "exp_avg.q".into(),
        Tensor::zeros([1], (Kind::Float, Device::Cpu)),
    ));
    for (state, expect) in [
        (bad_shape, "shape [3, 4]"),
        (missing, "missing exp_avg_sq.p"),
        (extra, "4 tensors"),
    ] {
        let err = opt.load_state_tensors(&state).unwrap_err().to_string();
        assert!(err.contains(expect), "{err}");
        for ((_, a), (_, b)) in opt.state_tensors().iter().zip(&before) {
            assert_eq!(
                max_abs_diff(&a.to_kind(Kind::Double), &b.to_kind(Kind::Double)),
                0.0
            );
        }
    }
}
