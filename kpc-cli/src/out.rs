//! Standard output for every subcommand: `outln!` and `out!` instead of `println!` and `print!`.
//!
//! Rust ignores SIGPIPE, so a write to a closed pipe (`kpc cache ls | head -1`) returns EPIPE, which
//! `println!` turns into a panic ("failed printing to stdout", exit 101). A CLI whose reader went
//! away has nothing left to do: these macros end the process quietly with status 0 instead, as
//! `ls | head -1` does. Any other write error (a full disk behind a redirect) is reported on stderr
//! with status 1, never a panic.

use std::fmt;
use std::io::{self, Write};

/// Writes `args` (plus a newline with `newline`) to stdout, or ends the process if stdout is gone.
pub fn write(args: fmt::Arguments<'_>, newline: bool) {
    let mut o = io::stdout().lock();
    let r = o
        .write_fmt(args)
        .and_then(|()| if newline { o.write_all(b"\n") } else { Ok(()) });
    if let Err(e) = r {
        drop(o);
        closed(&e);
    }
}

/// Flushes stdout (what is buffered of an unterminated line), or ends the process if stdout is gone.
pub fn flush() {
    if let Err(e) = io::stdout().lock().flush() {
        closed(&e);
    }
}

fn closed(e: &io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    // stderr may be gone too; there is nobody left to tell then.
    let _ = writeln!(io::stderr(), "kpc: cannot write to standard output: {e}");
    std::process::exit(1);
}

/// `println!` that ends the process quietly (status 0) when stdout is a closed pipe.
macro_rules! outln {
    () => {
        $crate::out::write(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*), true)
    };
}

/// `print!` that ends the process quietly (status 0) when stdout is a closed pipe.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*), false)
    };
}
