//! The error of a command: the whole error reply, starting with its code (`ERR ...`).

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdError(String);

impl CmdError {
    /// An `ERR` error with this message.
    pub fn err(msg: impl fmt::Display) -> CmdError {
        CmdError(format!("ERR {msg}"))
    }

    /// An error with its own code, e.g. `CmdError::code("NORING", "...")`.
    pub fn code(code: &str, msg: impl fmt::Display) -> CmdError {
        CmdError(format!("{code} {msg}"))
    }

    pub fn wrong_arity(command: &str) -> CmdError {
        CmdError(format!(
            "ERR wrong number of arguments for '{command}' command"
        ))
    }

    pub fn unknown_option(command: &str, arg: &[u8]) -> CmdError {
        CmdError::err(format!(
            "unknown option '{}' for '{command}'",
            crate::host::args::printable(arg)
        ))
    }

    /// An option that may be given once was given again.
    pub fn given_twice(option: &[u8]) -> CmdError {
        CmdError::err(format!(
            "{} is given twice",
            crate::host::args::printable(option).to_ascii_uppercase()
        ))
    }

    pub fn message(&self) -> &str {
        &self.0
    }
}

pub type CmdResult = Result<(), CmdError>;
