//! The sans-IO split is kept: nothing under `src/proto/` uses the iroh driver (`net`), the
//! host facts (`host`), tokio, iroh or the OS clock.

use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_protocol_core_imports_no_io() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/proto");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(files.len() >= 10, "found only {files:?}");
    let forbidden = [
        "crate::net",
        "crate::host",
        "tokio",
        "iroh",
        "SystemTime",
        "Instant",
        "std::net",
        "std::fs",
    ];
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in forbidden {
                assert!(
                    !code.contains(word),
                    "{}:{}: the sans-IO core uses {word}: {line}",
                    file.display(),
                    n + 1
                );
            }
        }
    }
}
