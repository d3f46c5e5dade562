//! The `leasegate` binary: chooses the allocator and hands over to
//! [`leasegate::cli::main`], which parses the command line, builds the
//! async runtime, runs the command and answers its exit code.

use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: a call allocates and frees many small
/// buffers (JSON values, headers, futures) across the runtime's threads, and
/// with glibc's malloc the proxy spent more CPU per call under load
/// (docs/performance.md). Only the binary chooses: the library
/// leaves the allocator to whoever embeds it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    leasegate::cli::main()
}
