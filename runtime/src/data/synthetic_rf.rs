//! The built-in synthetic RF modulation dataset: bursts of complex baseband samples of
//! BPSK, QPSK, 8PSK, 16QAM, 64QAM, PAM4, GFSK and OQPSK signals with a random carrier phase,
//! a small frequency offset, a random timing offset and AWGN at an SNR drawn uniformly from a
//! range. Deterministic for a seed: burst `i` depends only on `(seed, i)` and the settings.

use crate::backend::{HostData, HostTensor};
use cvc_compiler::front::limits;
use cvc_compiler::init::SplitMix64;
use cvc_compiler::ir::DType;
use std::f64::consts::PI;

/// The modulations, in class order; a dataset of `classes` classes uses the first `classes`.
pub const MODULATIONS: [&str; 8] = ["BPSK", "QPSK", "8PSK", "16QAM", "64QAM", "PAM4", "GFSK", "OQPSK"];

/// Samples per symbol of every modulation.
pub const SAMPLES_PER_SYMBOL: usize = 4;

/// Root-raised-cosine roll-off of the linear modulations.
pub const RRC_ROLLOFF: f64 = 0.35;

/// Largest carrier frequency offset, in cycles per sample.
pub const MAX_FREQ_OFFSET: f64 = 0.002;

/// RRC filter span in symbols.
const RRC_SPAN: usize = 8;

/// Settings of a synthetic RF dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct RfConfig {
    /// Number of classes (the first `classes` of [`MODULATIONS`]).
    pub classes: usize,
    /// Samples per burst.
    pub length: usize,
    /// SNR range in dB, drawn uniformly per burst.
    pub snr_db: (f64, f64),
    /// Number of bursts.
    pub count: usize,
    /// Generator seed.
    pub seed: u64,
}

impl RfConfig {
    /// Checks the settings, with a message naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if self.classes < 2 || self.classes > MODULATIONS.len() {
            return Err(format!(
                "synthetic.rf: classes = {} is outside 2..={} (available: {})",
                self.classes,
                MODULATIONS.len(),
                MODULATIONS.join(", ")
            ));
        }
        if self.length < 8 {
            return Err(format!("synthetic.rf: length = {} is too short (at least 8 samples)", self.length));
        }
        if self.count == 0 {
            return Err("synthetic.rf: count must be at least 1".into());
        }
        let (lo, hi) = self.snr_db;
        if !lo.is_finite() || !hi.is_finite() || lo > hi {
            return Err(format!("synthetic.rf: snr_db = {lo}..{hi} is not a valid range"));
        }
        // A burst is `length` c64 samples (8 bytes) and an i32 label; the whole set is held
        // in memory (and written at once by `cvc data rf`), so it must fit the data limit
        // before anything is allocated.
        let per_sample = (self.length as u64).saturating_mul(8).saturating_add(4);
        let limit = limits::max_data_bytes()?;
        limits::dataset_bytes("synthetic.rf", self.count as u64, per_sample, limit)
            .map_err(|e| format!("{e}; {}", limits::data_limit_help()))?;
        Ok(())
    }
}

/// The generated bursts: `iq` is `c64 [count, 1, length]`, `label` is `i32 [count]`.
#[derive(Clone, Debug, PartialEq)]
pub struct RfData {
    /// The complex baseband bursts.
    pub iq: HostTensor,
    /// The class of each burst (an index into [`MODULATIONS`]).
    pub label: HostTensor,
}

/// Generates the dataset. Labels cycle through the classes (`label[i] = i % classes`), so the
/// classes are balanced to within one burst.
pub fn generate(cfg: &RfConfig) -> Result<RfData, String> {
    cfg.validate()?;
    let taps = rrc_taps(RRC_ROLLOFF, SAMPLES_PER_SYMBOL, RRC_SPAN);
    let mut iq = Vec::with_capacity(2 * cfg.count * cfg.length);
    let mut labels = Vec::with_capacity(cfg.count);
    for i in 0..cfg.count {
        let class = i % cfg.classes;
        let mut rng = SplitMix64::new(burst_seed(cfg.seed, i as u64));
        let burst = burst(class, cfg, &taps, &mut rng);
        for z in burst {
            iq.push(z.0 as f32);
            iq.push(z.1 as f32);
        }
        labels.push(class as i32);
    }
    Ok(RfData {
        iq: HostTensor { dtype: DType::C64, shape: vec![cfg.count, 1, cfg.length], data: HostData::F32(iq) },
        label: HostTensor { dtype: DType::I32, shape: vec![cfg.count], data: HostData::I32(labels) },
    })
}

/// The generator state of burst `i`: a hash of `(seed, i)`. (Consecutive SplitMix64 states
/// would make burst `i + 1` a copy of burst `i` shifted by one draw; hashed states start the
/// bursts at unrelated points of the sequence.)
fn burst_seed(seed: u64, i: u64) -> u64 {
    let base = SplitMix64::new(seed ^ 0x5246_5F44_4154_4131).next_u64();
    SplitMix64::new(base ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
}

type C = (f64, f64);

fn cmul(a: C, b: C) -> C {
    (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)
}

/// One burst of `cfg.length` samples of modulation `class`, through the channel.
fn burst(class: usize, cfg: &RfConfig, taps: &[f64], rng: &mut SplitMix64) -> Vec<C> {
    let sps = SAMPLES_PER_SYMBOL;
    let n = cfg.length;
    let clean = match MODULATIONS[class] {
        "GFSK" => gfsk(n, sps, rng),
        "OQPSK" => {
            let nsym = n / sps + RRC_SPAN + 3;
            let syms: Vec<C> = (0..nsym).map(|_| constellation("QPSK", rng)).collect();
            let i_part: Vec<C> = syms.iter().map(|s| (s.0, 0.0)).collect();
            let q_part: Vec<C> = syms.iter().map(|s| (s.1, 0.0)).collect();
            let start = rng.next_u64() as usize % sps;
            let a = shape_pulses(&i_part, taps, sps, start, n);
            let b = shape_pulses(&q_part, taps, sps, start + sps / 2, n);
            a.iter().zip(&b).map(|(x, y)| (x.0, y.0)).collect()
        }
        name => {
            let nsym = n / sps + RRC_SPAN + 2;
            let syms: Vec<C> = (0..nsym).map(|_| constellation(name, rng)).collect();
            let start = rng.next_u64() as usize % sps;
            shape_pulses(&syms, taps, sps, start, n)
        }
    };
    channel(clean, cfg.snr_db, rng)
}

/// A random symbol of a linear modulation, unit average power.
fn constellation(name: &str, rng: &mut SplitMix64) -> C {
    let pick = |rng: &mut SplitMix64, m: u64| (rng.next_u64() % m) as f64;
    match name {
        "BPSK" => (2.0 * pick(rng, 2) - 1.0, 0.0),
        "QPSK" => {
            let k = pick(rng, 4);
            let a = PI / 4.0 + k * PI / 2.0;
            (a.cos(), a.sin())
        }
        "8PSK" => {
            let a = pick(rng, 8) * PI / 4.0;
            (a.cos(), a.sin())
        }
        "16QAM" => {
            let s = 10f64.sqrt();
            ((2.0 * pick(rng, 4) - 3.0) / s, (2.0 * pick(rng, 4) - 3.0) / s)
        }
        "64QAM" => {
            let s = 42f64.sqrt();
            ((2.0 * pick(rng, 8) - 7.0) / s, (2.0 * pick(rng, 8) - 7.0) / s)
        }
        "PAM4" => ((2.0 * pick(rng, 4) - 3.0) / 5f64.sqrt(), 0.0),
        other => unreachable!("{other} is not a linear modulation"),
    }
}

/// Upsamples `syms` by `sps` and filters with `taps`; returns `n` samples from `start` past
/// the filter's delay.
fn shape_pulses(syms: &[C], taps: &[f64], sps: usize, start: usize, n: usize) -> Vec<C> {
    let delay = taps.len() / 2;
    (0..n)
        .map(|t| {
            // Output sample index in the full convolution.
            let k = t + start + delay + sps * (RRC_SPAN / 2);
            // Symbol m sits at upsampled index m·sps and meets tap j = k - m·sps; taps in
            // ascending order (symbols in descending order).
            let mut acc = (0.0, 0.0);
            let lowest = (k + 1).saturating_sub(taps.len()).div_ceil(sps);
            for m in (lowest..=k / sps).rev() {
                if let Some(s) = syms.get(m) {
                    let h = taps[k - m * sps];
                    acc.0 += h * s.0;
                    acc.1 += h * s.1;
                }
            }
            acc
        })
        .collect()
}

/// Root-raised-cosine taps (`span` symbols, `sps` samples each), unit energy.
pub fn rrc_taps(beta: f64, sps: usize, span: usize) -> Vec<f64> {
    let len = span * sps + 1;
    let mid = (len / 2) as f64;
    let mut h: Vec<f64> = (0..len)
        .map(|i| {
            let t = (i as f64 - mid) / sps as f64;
            if t.abs() < 1e-12 {
                1.0 - beta + 4.0 * beta / PI
            } else if (t.abs() - 1.0 / (4.0 * beta)).abs() < 1e-9 {
                beta / 2f64.sqrt()
                    * ((1.0 + 2.0 / PI) * (PI / (4.0 * beta)).sin()
                        + (1.0 - 2.0 / PI) * (PI / (4.0 * beta)).cos())
            } else {
                let num = (PI * t * (1.0 - beta)).sin() + 4.0 * beta * t * (PI * t * (1.0 + beta)).cos();
                let den = PI * t * (1.0 - (4.0 * beta * t).powi(2));
                num / den
            }
        })
        .collect();
    let e: f64 = h.iter().map(|x| x * x).sum::<f64>().sqrt();
    for x in &mut h {
        *x /= e;
    }
    h
}

/// Gaussian frequency-shift keying: binary symbols, BT = 0.5, modulation index 0.5.
fn gfsk(n: usize, sps: usize, rng: &mut SplitMix64) -> Vec<C> {
    let bt = 0.5;
    let h_index = 0.5;
    let nsym = n / sps + 4;
    let raw: Vec<f64> = (0..nsym * sps)
        .map(|i| if i % sps == 0 { 2.0 * (rng.next_u64() % 2) as f64 - 1.0 } else { 0.0 })
        .collect();
    // Hold each symbol for `sps` samples, then smooth with a Gaussian of the given BT.
    let mut held = vec![0.0; raw.len()];
    let mut cur = 0.0;
    for (i, &r) in raw.iter().enumerate() {
        if i % sps == 0 {
            cur = r;
        }
        held[i] = cur;
    }
    let sigma = (2f64.ln()).sqrt() / (2.0 * PI * bt) * sps as f64;
    let half = 3 * sps / 2;
    let g: Vec<f64> = (0..=2 * half)
        .map(|k| {
            let x = k as f64 - half as f64;
            (-x * x / (2.0 * sigma * sigma)).exp()
        })
        .collect();
    let gs: f64 = g.iter().sum();
    let start = rng.next_u64() as usize % sps + sps;
    let mut phase = 0.0;
    (0..n)
        .map(|t| {
            let c = t + start;
            let mut f = 0.0;
            for (k, &w) in g.iter().enumerate() {
                if let Some(&x) = (c + k).checked_sub(half).and_then(|i| held.get(i)) {
                    f += w * x;
                }
            }
            phase += PI * h_index * f / gs / sps as f64;
            (phase.cos(), phase.sin())
        })
        .collect()
}

/// Carrier phase, frequency offset, unit power and AWGN at a random SNR.
fn channel(x: Vec<C>, snr_db: (f64, f64), rng: &mut SplitMix64) -> Vec<C> {
    let phi = rng.uniform(0.0, 2.0 * PI);
    let fo = rng.uniform(-MAX_FREQ_OFFSET, MAX_FREQ_OFFSET);
    let snr = if snr_db.1 > snr_db.0 { rng.uniform(snr_db.0, snr_db.1) } else { snr_db.0 };
    let power = x.iter().map(|z| z.0 * z.0 + z.1 * z.1).sum::<f64>() / x.len().max(1) as f64;
    let gain = if power > 0.0 { 1.0 / power.sqrt() } else { 1.0 };
    let sigma = (10f64.powf(-snr / 10.0) / 2.0).sqrt();
    x.into_iter()
        .enumerate()
        .map(|(t, z)| {
            let a = phi + 2.0 * PI * fo * t as f64;
            let r = cmul((z.0 * gain, z.1 * gain), (a.cos(), a.sin()));
            (r.0 + sigma * rng.normal(), r.1 + sigma * rng.normal())
        })
        .collect()
}
