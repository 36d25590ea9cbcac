//! Embeds the scenario corpus (`tests/scenarios/*.json`) and its JSON Schema
//! into `ccol`, so `ccol scenario check` and `ccol scenario schema` work from
//! any directory.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let dir = manifest.join("../../tests/scenarios");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().ends_with(".schema.json"))
        })
        .collect();
    files.sort();
    let mut out = String::from("/// The embedded scenario corpus: (file name, contents).\npub(crate) const SCENARIOS: &[(&str, &str)] = &[\n");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        writeln!(
            out,
            "    ({name:?}, include_str!({:?})),",
            f.canonicalize()?.display().to_string()
        )?;
    }
    out.push_str("];\n");
    let schema = dir.join("scenario.schema.json");
    println!("cargo:rerun-if-changed={}", schema.display());
    writeln!(
        out,
        "/// The JSON Schema of scenario files.\npub(crate) const SCHEMA: &str = include_str!({:?});",
        schema
            .canonicalize()
            .map_err(|e| format!("{}: {e}", schema.display()))?
            .display()
            .to_string()
    )?;
    std::fs::write(
        PathBuf::from(std::env::var("OUT_DIR")?).join("embedded.rs"),
        out,
    )?;
    Ok(())
}
