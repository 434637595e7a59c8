//! The `megatron` binary.

fn main() {
    std::process::exit(megatron::cli::main());
}
