//! Setup step: K-quant GGUFs of the SmolLM2 fixture, made by llama.cpp's own `llama-quantize`
//! (built from the pinned llama-cpp-python sdist, see [`crate::llama_cpp`]), for the tests
//! that check shoal's K-quant dequantization against gguf-py's and that the files answer.
//!
//! The fixture is Q4_1; `llama-quantize --allow-requantize` dequantizes it and quantizes
//! again, as it would an f16 file. The files land in `<cache>/kquants/`
//! ([`kit::dirs::kquant_fixture_path`]); a stamp naming the sdist, the input and the types
//! makes a second run free.

use crate::llama_cpp;
use crate::paths::default_model;
use crate::util::{run_quiet, sha256_file, Step};
use std::fs;
use std::process::Command;

/// The files made: (name, `llama-quantize` flags, type). The first three are the ones the
/// K-quant tests load and ask; the others are for the dequantization check only, so that the
/// files hold every type the loader reads. SmolLM2's rows of 576 are not a multiple of 256,
/// so only its FFN down projections take a K-quant and the rest a fallback type: Q4_K_M and
/// Q5_K_M give Q4_K/Q5_K, Q6_K and Q5_0/Q5_1/Q8_0; Q2_K gives Q3_K and Q4_0; `--pure` Q2_K
/// gives Q2_K; IQ4_NL (46 s to make, the others about 3 s) gives IQ4_NL.
pub const KQUANT_FILES: &[(&str, &[&str], &str)] = &[
    ("Q4_K_M", &[], "Q4_K_M"),
    ("Q5_K_M", &[], "Q5_K_M"),
    ("Q6_K", &[], "Q6_K"),
    ("Q2_K", &[], "Q2_K"),
    ("Q2_K_pure", &["--pure"], "Q2_K"),
    ("IQ4_NL", &[], "IQ4_NL"),
];

/// Builds `llama-quantize` if needed and writes every file of [`KQUANT_FILES`].
pub fn kquant_fixtures(step: Step) -> Result<(), String> {
    let input = default_model();
    let dir = kit::dirs::kquant_fixture_path("x")
        .parent()
        .expect("a fixture path has a folder")
        .to_path_buf();
    let stamp_path = dir.join(".shoal-ok");
    let input_sha = fs::read_to_string(input.with_extension("gguf.sha256"))
        .map_err(|e| format!("{}: {e} (the fixture step comes first)", input.display()))?;
    let stamp = format!(
        "llama-cpp-python={}\ninput={}\ntypes={}\n",
        crate::reference::LLAMA_CPP_PYTHON_VERSION,
        input_sha.trim(),
        KQUANT_FILES
            .iter()
            .map(|(name, flags, ty)| format!("{name}:{}:{ty}", flags.join(" ")))
            .collect::<Vec<_>>()
            .join(",")
    );
    let all_there = KQUANT_FILES
        .iter()
        .all(|(name, _, _)| kit::dirs::kquant_fixture_path(name).exists());
    if all_there && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        step.cached(&dir.display().to_string());
        return Ok(());
    }
    let quantize = llama_cpp::quantize_tool(&step)?;
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let _ = fs::remove_file(&stamp_path);
    let mut sums = String::new();
    for (name, flags, ty) in KQUANT_FILES {
        step.progress(&format!(
            "llama-quantize {} {ty} -> {name}",
            flags.join(" ")
        ));
        let out = kit::dirs::kquant_fixture_path(name);
        let partial = out.with_extension("gguf.partial");
        run_quiet(
            Command::new(&quantize)
                .arg("--allow-requantize")
                .args(*flags)
                .arg(&input)
                .arg(&partial)
                .arg(ty),
        )?;
        fs::rename(&partial, &out).map_err(|e| e.to_string())?;
        sums.push_str(&format!("{}  {}\n", sha256_file(&out)?, out.display()));
    }
    fs::write(dir.join("SHA256SUMS"), sums).map_err(|e| e.to_string())?;
    fs::write(&stamp_path, stamp).map_err(|e| e.to_string())?;
    step.done(&dir.display().to_string());
    Ok(())
}
