//! Protocol status codes. Errors travel as these, never as raw errno numbers, so that
//! client and server need not share an operating system's numbering.

/// Why a request failed: the first field of an Error frame (kind 0xff). Success responses
/// carry no status; their kind says what they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    /// Success; the response's fields follow.
    Ok = 0,
    /// No such file or directory.
    NotFound = 1,
    /// A path component, or the target of a directory request, is not a directory.
    NotDirectory = 2,
    /// A file request named a directory.
    IsDirectory = 3,
    /// The server may not read it (permissions).
    PermissionDenied = 4,
    /// A name or path was refused: `..`, `.`, empty, contains NUL, absolute, or too long.
    InvalidName = 5,
    /// `ReadLink` on something that is not a symlink, or a request on a kind it does not apply to.
    InvalidArgument = 6,
    /// A path component is a symlink: the server never follows links.
    SymlinkInPath = 7,
    /// An I/O error on the server's disk.
    Io = 8,
    /// The request was well-formed but outside negotiated limits (e.g. read longer than a chunk).
    TooLarge = 9,
    /// The server is shedding load; retry later.
    Busy = 10,
    /// The operation is not supported by this server.
    Unsupported = 11,
    /// Authentication failed.
    AuthFailed = 12,
    /// A name was longer than the server's file system allows.
    NameTooLong = 13,
}

impl Status {
    /// Decodes a status; unknown codes map to `None` (the caller reports a protocol error).
    pub fn from_u16(v: u16) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::NotDirectory,
            3 => Status::IsDirectory,
            4 => Status::PermissionDenied,
            5 => Status::InvalidName,
            6 => Status::InvalidArgument,
            7 => Status::SymlinkInPath,
            8 => Status::Io,
            9 => Status::TooLarge,
            10 => Status::Busy,
            11 => Status::Unsupported,
            12 => Status::AuthFailed,
            13 => Status::NameTooLong,
            _ => return None,
        })
    }

    /// Every status, for exhaustive tests.
    pub const ALL: [Status; 14] = [
        Status::Ok,
        Status::NotFound,
        Status::NotDirectory,
        Status::IsDirectory,
        Status::PermissionDenied,
        Status::InvalidName,
        Status::InvalidArgument,
        Status::SymlinkInPath,
        Status::Io,
        Status::TooLarge,
        Status::Busy,
        Status::Unsupported,
        Status::AuthFailed,
        Status::NameTooLong,
    ];
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Ok => "ok",
            Status::NotFound => "not found",
            Status::NotDirectory => "not a directory",
            Status::IsDirectory => "is a directory",
            Status::PermissionDenied => "permission denied",
            Status::InvalidName => "invalid name",
            Status::InvalidArgument => "invalid argument",
            Status::SymlinkInPath => "symlink in path (the server never follows links)",
            Status::Io => "I/O error on the server",
            Status::TooLarge => "request exceeds negotiated limits",
            Status::Busy => "server busy",
            Status::Unsupported => "unsupported operation",
            Status::AuthFailed => "authentication failed",
            Status::NameTooLong => "name too long",
        })
    }
}
