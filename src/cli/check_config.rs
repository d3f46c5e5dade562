//! `leasegate check-config FILE…`: each file checked as what it is (a main
//! config, an adapter or a policy) and as runnable (its upstream commands
//! found), one line per file. Reads files only; writes nothing.

use crate::control::exit;

/// `leasegate check-config`: one line per file (and a `note` line for what
/// a valid file leaves to defaults worth knowing); the exit code is the first
/// failing file's problem (`config::Problem::exit_code`: 1 invalid, 12
/// upstream command, 13 database URL, 14 timeouts out of order), 0 when
/// every file is valid.
pub(super) fn check_config(files: &[std::path::PathBuf]) -> u8 {
    let mut first = None;
    let mut failed = 0;
    for file in files {
        let checked = crate::config::check_file(file).and_then(|kind| {
            let notes = crate::config::check_runnable(file, kind)?;
            Ok((kind, notes))
        });
        match checked {
            Ok((kind, notes)) => {
                println!("ok   {} ({kind})", file.display());
                for note in notes {
                    println!("note {}: {note}", file.display());
                }
            }
            Err(error) => {
                failed += 1;
                first.get_or_insert(error.problem.exit_code());
                println!("FAIL {error}");
            }
        }
    }
    match first {
        Some(code) => {
            eprintln!("leasegate: {failed} of {} files invalid", files.len());
            code
        }
        None => exit::OK,
    }
}
