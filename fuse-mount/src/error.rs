//! Errors of the file system and the errno each becomes.

use ferry_client::ClientError;
use ferry_proto::name::NameError;
use ferry_proto::Status;

/// A failed file system operation: the errno for the kernel and what caused it.
#[derive(Debug, thiserror::Error)]
#[error("{message} (errno {errno})")]
pub struct Error {
    /// Positive errno sent to the kernel.
    pub errno: i32,
    /// What failed, for the log.
    pub message: String,
    /// The client error behind it, when there is one.
    #[source]
    pub source: Option<ClientError>,
}

/// Turns a failure into the errno a reader sees.
pub trait ToErrno {
    /// The errno.
    fn to_errno(&self) -> i32;
}

impl ToErrno for Status {
    fn to_errno(&self) -> i32 {
        match self {
            // Ok never travels as an error; EIO if a broken server sends it anyway.
            Status::Ok => libc::EIO,
            Status::NotFound => libc::ENOENT,
            Status::NotDirectory => libc::ENOTDIR,
            Status::IsDirectory => libc::EISDIR,
            Status::PermissionDenied => libc::EACCES,
            Status::InvalidName => libc::EINVAL,
            Status::InvalidArgument => libc::EINVAL,
            // A symlink in a parent component: the path as given cannot be resolved here.
            Status::SymlinkInPath => libc::ELOOP,
            Status::Io => libc::EIO,
            Status::TooLarge => libc::EINVAL,
            // The server gives up on a file that keeps changing while it reads it; EAGAIN
            // ("try again") describes that better than EIO, though most tools treat both
            // as fatal for that file.
            Status::Busy => libc::EAGAIN,
            Status::Unsupported => libc::ENOSYS,
            Status::AuthFailed => libc::EACCES,
            Status::NameTooLong => libc::ENAMETOOLONG,
        }
    }
}

impl ToErrno for ClientError {
    fn to_errno(&self) -> i32 {
        match self {
            ClientError::Remote { status, .. } => status.to_errno(),
            ClientError::InvalidName(NameError::TooLong) => libc::ENAMETOOLONG,
            ClientError::InvalidName(NameError::Empty | NameError::Dot | NameError::BadByte) => {
                libc::EINVAL
            }
            // Transport failures: the reader gets EIO, never wrong bytes. Debatable: a lost
            // server could be ETIMEDOUT or ENOTCONN, but tools treat those as odd for a
            // file, and EIO is what network file systems (NFS hard mounts aside) report.
            ClientError::Timeout(_)
            | ClientError::ConnectionLost
            | ClientError::Unreachable { .. }
            | ClientError::S3(_) => libc::EIO,
            // Setting up a stream failed. Only `Client::connect` returns these (a failed
            // reconnect reaches a request as `Unreachable`), so a reader should never see
            // them. Debatable: EACCES would fit a refused token, but the reader can do
            // nothing about it, and the log has the reason.
            ClientError::Connect { .. }
            | ClientError::Preamble { .. }
            | ClientError::PreambleClosed { .. }
            | ClientError::Tls { .. }
            | ClientError::Handshake { .. }
            | ClientError::HandshakeIo { .. }
            | ClientError::NoRandom { .. } => libc::EIO,
            // The server broke the protocol or sent corrupt bytes (each refetched before
            // this): EIO rather than anything that could pass for the file's contents.
            ClientError::Protocol(_)
            | ClientError::Decode(_)
            | ClientError::BadEntryName(_)
            | ClientError::Payload(_) => libc::EIO,
            // The file changed while a handle read it: the read path decides (ESTALE for
            // another inode, the bytes when they may be served); anything left is EIO.
            ClientError::Changed(_) => libc::EIO,
        }
    }
}

impl From<ClientError> for Error {
    fn from(source: ClientError) -> Self {
        Error {
            errno: source.to_errno(),
            message: source.to_string(),
            source: Some(source),
        }
    }
}

impl Error {
    /// An error with a fixed errno (e.g. EROFS, EBADF).
    pub fn errno(errno: i32, why: &str) -> Error {
        Error {
            errno,
            message: why.to_string(),
            source: None,
        }
    }
}
