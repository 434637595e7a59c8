//! The chunked SSD scan against the sequential recurrence (forward and every gradient) for
//! several chunk sizes and sequence lengths that are not multiples of the chunk, and both
//! against central finite differences. Tolerances: forward 2e-5 and gradients 1e-4 of the
//! tensor's largest magnitude (f32, different summation orders); finite differences 2e-2
//! relative (f32 central differences with eps 1e-2).

use megatron_hybrid::ops::ssd::{ssd_backward, ssd_forward, SsdGrads, SsdInputs};
use megatron_hybrid::ops::ssd_ref::{ssd_reference_backward, ssd_reference_forward};
use megatron_hybrid::ops::SsdDims;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Data {
    x: Vec<f32>,
    dt: Vec<f32>,
    a: Vec<f32>,
    bm: Vec<f32>,
    cm: Vec<f32>,
    d: Vec<f32>,
    dy: Vec<f32>,
}

impl Data {
    fn new(dm: &SsdDims, seed: u64) -> Data {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut u = |n: usize, lo: f32, hi: f32| (0..n).map(|_| r.gen_range(lo..hi)).collect::<Vec<f32>>();
        let rows = dm.batch * dm.seq;
        Data {
            x: u(rows * dm.heads * dm.head_dim, -1.0, 1.0),
            dt: u(rows * dm.heads, 0.01, 0.6),
            a: u(dm.heads, -3.0, -0.3),
            bm: u(rows * dm.groups * dm.state, -1.0, 1.0),
            cm: u(rows * dm.groups * dm.state, -1.0, 1.0),
            d: u(dm.heads, 0.5, 1.5),
            dy: u(rows * dm.heads * dm.head_dim, -1.0, 1.0),
        }
    }
    fn inputs(&self) -> SsdInputs<'_> {
        SsdInputs { x: &self.x, dt: &self.dt, a: &self.a, bm: &self.bm, cm: &self.cm, d: &self.d }
    }
}

fn dims(seq: usize, chunk: usize) -> SsdDims {
    SsdDims { batch: 2, seq, heads: 4, head_dim: 3, groups: 2, state: 5, chunk }
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn grads(g: &SsdGrads) -> [(&'static str, &Vec<f32>); 6] {
    [("x", &g.x), ("dt", &g.dt), ("A", &g.a), ("B", &g.bm), ("C", &g.cm), ("D", &g.d)]
}

#[test]
fn chunked_scan_matches_the_sequential_recurrence() {
    for &seq in &[1usize, 7, 13, 33] {
        for &chunk in &[1usize, 4, 5, 8, 64] {
            let dm = dims(seq, chunk);
            let data = Data::new(&dm, (seq * 100 + chunk) as u64);
            let (y, states) = ssd_forward(&dm, &data.inputs()).unwrap();
            let y_ref = ssd_reference_forward(&dm, &data.inputs()).unwrap();
            let e = max_rel(&y, &y_ref);
            assert!(e < 2e-5, "forward seq {seq} chunk {chunk}: rel err {e}");
            let g = ssd_backward(&dm, &data.inputs(), &states, &data.dy).unwrap();
            let g_ref = ssd_reference_backward(&dm, &data.inputs(), &data.dy).unwrap();
            for ((name, a), (_, b)) in grads(&g).into_iter().zip(grads(&g_ref)) {
                let e = max_rel(a, b);
                assert!(e < 1e-4, "d{name} seq {seq} chunk {chunk}: rel err {e}");
            }
        }
    }
}

/// Picks one input tensor of [`Data`].
type Field = fn(&mut Data) -> &mut Vec<f32>;

/// `Σ y·dy` in f64 for finite differences.
fn loss(dm: &SsdDims, d: &Data) -> f64 {
    let y = ssd_forward(dm, &d.inputs()).unwrap().0;
    y.iter().zip(&d.dy).map(|(a, b)| *a as f64 * *b as f64).sum()
}

#[test]
fn chunked_backward_matches_finite_differences() {
    let dm = dims(11, 4);
    let data = Data::new(&dm, 7);
    let (_, states) = ssd_forward(&dm, &data.inputs()).unwrap();
    let g = ssd_backward(&dm, &data.inputs(), &states, &data.dy).unwrap();
    let eps = 1e-2f32;
    let fields: [(&str, Field, &Vec<f32>); 6] = [
        ("x", |d| &mut d.x, &g.x),
        ("dt", |d| &mut d.dt, &g.dt),
        ("A", |d| &mut d.a, &g.a),
        ("B", |d| &mut d.bm, &g.bm),
        ("C", |d| &mut d.cm, &g.cm),
        ("D", |d| &mut d.d, &g.d),
    ];
    for (name, field, analytic) in fields {
        let len = analytic.len();
        for i in [0, len / 3, len / 2, len - 1] {
            let mut d = Data::new(&dm, 7);
            field(&mut d)[i] += eps;
            let plus = loss(&dm, &d);
            field(&mut d)[i] -= 2.0 * eps;
            let minus = loss(&dm, &d);
            let numeric = (plus - minus) / (2.0 * eps as f64);
            let a = analytic[i] as f64;
            let rel = (a - numeric).abs() / a.abs().max(numeric.abs()).max(0.05);
            assert!(rel < 2e-2, "d{name}[{i}]: analytic {a} numeric {numeric} rel {rel}");
        }
    }
}

#[test]
fn scan_is_independent_of_the_thread_count() {
    let dm = dims(21, 8);
    let data = Data::new(&dm, 3);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let (y, s) = ssd_forward(&dm, &data.inputs()).unwrap();
            let g = ssd_backward(&dm, &data.inputs(), &s, &data.dy).unwrap();
            (y, g.bm, g.a)
        })
    };
    assert_eq!(run(1), run(3));
}
