//! Standard output of the commands that print. A reader that stops reading
//! (`causeway leases | head -3`) is an ordinary way for such a command to
//! end: the write fails with a broken pipe, which ends the command quietly
//! and successfully rather than as a panic (`println!`) or an error.

use std::io::{self, Write};

/// Writes `args` and a newline to standard output.
pub fn line(args: std::fmt::Arguments) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)?;
    out.write_all(b"\n")
}

/// Writes `text` to standard output as it is.
pub fn text(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Whether `e` is standard output's reader having gone away.
pub fn reader_gone(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<io::Error>())
        .any(|e| e.kind() == io::ErrorKind::BrokenPipe)
}

/// `println!`, returning the write's result instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;
