//! The ginx daemon. All logic lives in the library.

fn main() -> std::process::ExitCode {
    ginx::cli::ginx_main()
}
