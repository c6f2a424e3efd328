//! ginxctl: talks to the ginx daemon over its control socket. All logic lives in the library.

fn main() -> std::process::ExitCode {
    ginx::cli::ginxctl_main()
}
