//! The `leasegate` binary: parses the command line, builds the async
//! runtime and hands over to [`leasegate::cli`], which runs every command
//! and answers its exit code.

use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: a call allocates and frees many small
/// buffers (JSON values, headers, futures) across the runtime's threads, and
/// with glibc's malloc the proxy spent more CPU per call under load
/// (docs/performance.md). Only the binary chooses: the library
/// leaves the allocator to whoever embeds it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = leasegate::cli::Cli::from_args();
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.worker_threads())
        .enable_all()
        .build()
    {
        Ok(runtime) => {
            let code = runtime.block_on(leasegate::cli::run(cli));
            // A blocking read of stdin (`leasegate stdio` stopped by a
            // signal while its client keeps stdin open) never ends: the
            // process exits without waiting for it.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            code
        }
        Err(error) => {
            eprintln!("leasegate: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}
