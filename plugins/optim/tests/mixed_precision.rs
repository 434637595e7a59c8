//! The mixed-precision optimizer (SPEC §6.7): fp32 main parameters behind bf16 model
//! parameters, gradients lent (fp32) or widened (bf16), and a state that resumes exactly.

use megatron_core::half::bf16;
use megatron_core::{Backend, DType, HostBuffer, Optimizer, Param, ParamLayout};
use megatron_cpu::CpuBackend;
use megatron_optim::{take_main_params, Adam, AdamConfig, MixedPrecisionOptimizer};

fn bf16_param(b: &dyn Backend, values: &[f32], grad_dtype: DType) -> Param {
    let shape = [values.len()];
    let v = HostBuffer::BF16(values.iter().map(|&x| bf16::from_f32(x)).collect());
    Param {
        name: "w".into(),
        value: b.from_host(v, &shape).unwrap(),
        grad: b.zeros(&shape, grad_dtype).unwrap(),
        layout: ParamLayout::replicated(&shape, true),
    }
}

fn set_grad(b: &dyn Backend, p: &mut Param, g: f32) {
    let n = p.grad.numel();
    let src = b.from_host(HostBuffer::F32(vec![g; n]), &[n]).unwrap();
    b.cast(&src, &mut p.grad).unwrap();
}

fn values(b: &dyn Backend, p: &Param) -> Vec<f32> {
    b.to_host(&p.value).unwrap().to_f32_vec()
}

fn adam() -> Box<dyn Optimizer> {
    Box::new(Adam::new(AdamConfig::default()).unwrap())
}

/// Adam moves a weight by about `lr` per step; at 1.0 bf16 values are 2^-7 apart, so steps of
/// 1e-4 are rounded away on a bf16 parameter but add up in the fp32 main copy.
#[test]
fn small_updates_accumulate_in_the_fp32_main_params() {
    let b = CpuBackend::new();
    for grad_dtype in [DType::F32, DType::BF16] {
        let (mut plain_p, mut mp_p) = (bf16_param(&b, &[1.0; 4], grad_dtype), bf16_param(&b, &[1.0; 4], grad_dtype));
        let (mut plain, mut mp) = (adam(), MixedPrecisionOptimizer::new(adam()));
        for _ in 0..100 {
            set_grad(&b, &mut plain_p, 0.5);
            set_grad(&b, &mut mp_p, 0.5);
            plain.step(&mut [&mut plain_p], 1e-4, 0.0, &b).unwrap();
            mp.step(&mut [&mut mp_p], 1e-4, 0.0, &b).unwrap();
        }
        assert_eq!(values(&b, &plain_p), vec![1.0; 4], "plain Adam on bf16 loses every update");
        let v = values(&b, &mp_p)[0];
        // 100 steps of ~1e-4: the main param is ~0.99, the nearest bf16 value 0.98828125.
        assert_eq!(v, 0.98828125, "grad {grad_dtype}: bf16 value {v}");
        assert_eq!(mp_p.value.dtype(), DType::BF16);
        assert_eq!(mp_p.grad.dtype(), grad_dtype, "the model keeps its gradient buffer");
        assert_eq!(mp.main_numel(), 4);
    }
}

#[test]
fn state_round_trip_resumes_bit_identically() {
    let b = CpuBackend::new();
    let grads = [0.3f32, -1.0, 0.7, 0.01, 2.0, -0.4];
    let run = |p: &mut Param, opt: &mut dyn Optimizer, gs: &[f32]| {
        for &g in gs {
            set_grad(&b, p, g);
            opt.step(&mut [&mut *p], 1e-3, 0.1, &b).unwrap();
        }
    };
    let mut full_p = bf16_param(&b, &[0.5, -0.25, 2.0], DType::F32);
    let mut full = MixedPrecisionOptimizer::new(adam());
    run(&mut full_p, &mut full, &grads);

    let mut a_p = bf16_param(&b, &[0.5, -0.25, 2.0], DType::F32);
    let mut a = MixedPrecisionOptimizer::new(adam());
    run(&mut a_p, &mut a, &grads[..3]);
    let mut state = a.state(&b).unwrap();
    assert!(state.tensors.iter().any(|(k, t)| k == "w.main_param" && t.dtype() == DType::F32));
    // A fresh optimizer and a parameter holding only the bf16 values (as a checkpoint would).
    let mut b_p = bf16_param(&b, &values(&b, &a_p), DType::F32);
    let mut resumed = MixedPrecisionOptimizer::new(adam());
    resumed.load_state(a.state(&b).unwrap(), &[&b_p], &b).unwrap();
    run(&mut b_p, &mut resumed, &grads[3..]);
    assert_eq!(values(&b, &b_p), values(&b, &full_p), "resume is bit-identical");
    assert_eq!(resumed.steps(), 6);

    // take_main_params leaves a plain Adam state (for an fp32 run continuing the bf16 one).
    let main = take_main_params(&mut state);
    assert_eq!(main.keys().collect::<Vec<_>>(), ["w"]);
    let mut plain = adam();
    plain.load_state(state, &[&a_p], &b).unwrap();
}
