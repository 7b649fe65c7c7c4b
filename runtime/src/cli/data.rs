//! `cvc data rf --out FILE.npz [--classes N] [--length N] [--count N] [--seed N]
//! [--snr-db LO..HI]`: writes the built-in synthetic RF modulation dataset as a `.npz` with
//! arrays `iq` (complex64 `[N, 1, L]`) and `label` (int32 `[N]`).
//!
//! `cvc data sar --out FILE.npz [--count N] [--size N] [--classes N] [--scr-db LO..HI]
//! [--looks N] [--seed N]`: writes the synthetic SAR dataset with arrays `image` (complex64
//! `[N, 1, S, S]`) and `label` (int32 `[N]`).
//!
//! `cvc data polsar --out FILE.npz [--count N] [--size N] [--classes N] [--regions N]
//! [--gain-db X] [--contrast X] [--ignore-index K] [--seed N]`: writes the synthetic PolSAR
//! segmentation dataset with arrays `image` (complex64 `[N, 3, S, S]`) and `label` (int32
//! `[N, S, S]`, unlabelled pixels `K`).

use super::{CliError, CliResult};
use crate::data::npy;
use crate::data::synthetic_polsar::{self, PolsarConfig, CLASSES};
use crate::data::synthetic_rf::{self, RfConfig, MODULATIONS};
use crate::data::synthetic_sar::{self, SarConfig, SHAPES};
use std::path::PathBuf;

/// Arguments of `cvc data`.
#[derive(clap::Args, Debug)]
pub struct DataArgs {
    /// Which dataset.
    #[command(subcommand)]
    pub dataset: Dataset,
}

/// The built-in datasets.
#[derive(clap::Subcommand, Debug)]
pub enum Dataset {
    /// Synthetic RF modulation bursts (BPSK, QPSK, 8PSK, 16QAM, 64QAM, PAM4, GFSK, OQPSK).
    Rf(RfArgs),
    /// Synthetic SAR image chips: one vehicle (tank, truck, car, radar, launcher, apc) of
    /// point scatterers, diffuse body return and radar shadow on textured clutter.
    Sar(SarArgs),
    /// Synthetic PolSAR scenes for segmentation: HH, HV, VV scattering vectors in random
    /// regions of scattering classes (surface, double_bounce, volume, oriented, helix), with
    /// per-pixel labels.
    Polsar(PolsarArgs),
}

/// Arguments of `cvc data rf`.
#[derive(clap::Args, Debug)]
pub struct RfArgs {
    /// Output `.npz` file.
    #[arg(long)]
    pub out: PathBuf,
    /// Number of classes (the first N modulations).
    #[arg(long, default_value_t = 5)]
    pub classes: usize,
    /// Samples per burst.
    #[arg(long, default_value_t = 512)]
    pub length: usize,
    /// Number of bursts.
    #[arg(long, default_value_t = 10000)]
    pub count: usize,
    /// Generator seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// SNR range in dB, `LO..HI`.
    #[arg(long, default_value = "0..20", value_parser = parse_range)]
    pub snr_db: (f64, f64),
}

/// Arguments of `cvc data sar` (defaults as `synthetic.sar(...)` in a train section).
#[derive(clap::Args, Debug)]
pub struct SarArgs {
    /// Output `.npz` file.
    #[arg(long)]
    pub out: PathBuf,
    /// Number of images.
    #[arg(long, default_value_t = 4000)]
    pub count: usize,
    /// Image side in pixels.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Number of classes (the first N vehicle types).
    #[arg(long, default_value_t = 4)]
    pub classes: usize,
    /// Signal-to-clutter ratio range in dB, `LO..HI`.
    #[arg(long, default_value = "10..20", value_parser = parse_range)]
    pub scr_db: (f64, f64),
    /// Looks of the clutter texture.
    #[arg(long, default_value_t = 4)]
    pub looks: usize,
    /// Generator seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Arguments of `cvc data polsar` (defaults as `synthetic.polsar(...)` in a train section).
#[derive(clap::Args, Debug)]
pub struct PolsarArgs {
    /// Output `.npz` file.
    #[arg(long)]
    pub out: PathBuf,
    /// Number of scenes.
    #[arg(long, default_value_t = 2000)]
    pub count: usize,
    /// Scene side in pixels.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Number of classes (the first N scattering classes).
    #[arg(long, default_value_t = 5)]
    pub classes: usize,
    /// Voronoi regions per scene.
    #[arg(long, default_value_t = 8)]
    pub regions: usize,
    /// Per-region gain range in dB (±).
    #[arg(long, default_value_t = 3.0)]
    pub gain_db: f64,
    /// Distance of the class covariances from their mean, in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    pub contrast: f64,
    /// Label of unlabelled pixels (the model's `ignore_index`).
    #[arg(long, default_value_t = -100, allow_negative_numbers = true)]
    pub ignore_index: i32,
    /// Generator seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Parses `LO..HI` (or a single value).
pub fn parse_range(s: &str) -> Result<(f64, f64), String> {
    let bad = || format!("'{s}' is not a range like 0..20");
    match s.split_once("..") {
        Some((a, b)) => Ok((a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?)),
        None => {
            let x: f64 = s.trim().parse().map_err(|_| bad())?;
            Ok((x, x))
        }
    }
}

/// Runs `cvc data`.
pub fn run(args: &DataArgs) -> CliResult {
    match &args.dataset {
        Dataset::Rf(a) => {
            let cfg = RfConfig {
                classes: a.classes,
                length: a.length,
                snr_db: a.snr_db,
                count: a.count,
                seed: a.seed,
            };
            let d = synthetic_rf::generate(&cfg).map_err(CliError::Message)?;
            npy::save_npz(&a.out, &[("iq", &d.iq), ("label", &d.label)]).map_err(CliError::Message)?;
            outln!(
                "wrote {}: iq complex64 [{}, 1, {}], label int32 [{}]; classes {}",
                a.out.display(),
                a.count,
                a.length,
                a.count,
                MODULATIONS[..a.classes].join(", ")
            )
        }
        Dataset::Sar(a) => {
            let cfg = SarConfig {
                classes: a.classes,
                size: a.size,
                scr_db: a.scr_db,
                looks: a.looks,
                count: a.count,
                seed: a.seed,
            };
            let d = synthetic_sar::generate(&cfg).map_err(CliError::Message)?;
            npy::save_npz(&a.out, &[("image", &d.image), ("label", &d.label)]).map_err(CliError::Message)?;
            outln!(
                "wrote {}: image complex64 [{}, 1, {}, {}], label int32 [{}]; classes {}",
                a.out.display(),
                a.count,
                a.size,
                a.size,
                a.count,
                SHAPES[..a.classes].join(", ")
            )
        }
        Dataset::Polsar(a) => {
            let cfg = PolsarConfig {
                classes: a.classes,
                size: a.size,
                regions: a.regions,
                gain_db: a.gain_db,
                contrast: a.contrast,
                count: a.count,
                seed: a.seed,
                ignore_index: a.ignore_index,
            };
            let d = synthetic_polsar::generate(&cfg).map_err(CliError::Message)?;
            npy::save_npz(&a.out, &[("image", &d.image), ("label", &d.label)]).map_err(CliError::Message)?;
            outln!(
                "wrote {}: image complex64 [{}, 3, {}, {}], label int32 [{}, {}, {}] (unlabelled {}); classes {}",
                a.out.display(),
                a.count,
                a.size,
                a.size,
                a.count,
                a.size,
                a.size,
                a.ignore_index,
                CLASSES[..a.classes].join(", ")
            )
        }
    }
}
