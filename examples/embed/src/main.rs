//! Embedding cvc in a Rust program: compile a `.cvnn` model from a string, open a session on
//! the best available device, train a few steps on synthetic RF bursts, run inference, save
//! the weights, and print the static memory plan.
//!
//! Run with `cargo run --release -p cvc-embed-example`.

use cvc_runtime::data::synthetic_rf::{RfConfig, MODULATIONS};
use cvc_runtime::data::Dataset;
use cvc_runtime::metrics::{argmax, human_bytes};
use cvc_runtime::session::{Device, Model};

const MODEL: &str = "
model Burst {
    input iq:    c64[B, 1, 128]
    input label: class[B] of 4

    logits = iq
        |> conv1d(8, kernel = 5, pad = 2) |> batchnorm(kind = naive) |> modrelu
        |> maxpool1d(2)
        |> conv1d(16, kernel = 3, pad = 1) |> modrelu
        |> abs |> global_avgpool |> linear(4) |> real
    output logits
    loss cross_entropy(logits, label)
}

train Burst {
    batch     = 32
    optimizer = adam(lr = 1e-2)
    seed      = 1
}
";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = Model::from_source("burst.cvnn", MODEL)?;
    let mut session = model.session(Device::Auto)?;
    println!("model {} on {}, batch {}", model.name(), session.device_name(), session.batch());

    let cfg = RfConfig { classes: 4, length: 128, snr_db: (5.0, 20.0), count: 1024, seed: 3 };
    let data = Dataset::synthetic_rf(&cfg, model.inputs())?;
    let batch = session.batch();
    for step in 0..100 {
        let start = (step * batch) % (data.len - batch);
        let idx: Vec<usize> = (start..start + batch).collect();
        let report = session.train_step(&data.gather(&idx))?;
        if step % 20 == 0 || step == 99 {
            println!("step {step:>3}  loss {:.4}", report.loss);
        }
    }

    let probe: Vec<usize> = (0..8).collect();
    let outputs = session.infer(&data.gather(&probe))?;
    let logits = outputs[0].1.f32s();
    let names: Vec<&str> = logits.chunks_exact(4).map(|row| MODULATIONS[argmax(row)]).collect();
    println!("predictions for bursts 0..8: {}", names.join(" "));
    if let Some(cvc_runtime::backend::HostData::I32(labels)) = data.array("label").map(|t| &t.data) {
        let truth: Vec<&str> = labels[..8].iter().map(|&l| MODULATIONS[l as usize]).collect();
        println!("true classes:                {}", truth.join(" "));
    }

    let path = std::env::temp_dir().join("cvc-embed-burst.safetensors");
    session.save_weights(&path)?;
    println!("weights saved to {}", path.display());

    let plan = session.plan();
    println!(
        "memory plan: arena {} (lower bound {}, parameters and state {}), {} buffers alive at the peak",
        human_bytes(plan.arena_bytes as u64),
        human_bytes(plan.lower_bound_bytes as u64),
        human_bytes(plan.persistent_bytes as u64),
        plan.live_at_peak.len()
    );
    Ok(())
}
