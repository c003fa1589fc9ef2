//! `cargo run -p inference --example export_hf -- MODEL OUT_DIR [f32|bf16]`: writes a model
//! (GGUF or folder) as a Hugging Face folder, e.g. for mlx-lm in `cargo xtask bench inference`.
use mlx_rs::Dtype;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!("usage: export_hf MODEL OUT_DIR [f32|bf16]");
        return std::process::ExitCode::from(2);
    }
    let dtype = match args.get(2).map(String::as_str) {
        Some("bf16") => Dtype::Bfloat16,
        _ => Dtype::Float32,
    };
    match inference::export::export_hf_folder(args[0].as_ref(), args[1].as_ref(), dtype) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
