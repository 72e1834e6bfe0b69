//! Reading a `--token-file` (ferryd's and the clients'): the same one-line errors on both
//! sides.

use std::path::{Path, PathBuf};

use ferry_proto::auth::{Token, TokenError};

/// Why a token file gave no token.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// The file cannot be read.
    #[error("--token-file {}: cannot read it: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it returned.
        source: std::io::Error,
    },
    /// What it holds is not a token.
    #[error("--token-file {}: {source}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Why not.
        source: TokenError,
    },
}

/// The token in the token file `path`.
///
/// # Errors
/// The file cannot be read, or holds too short a token.
pub fn read_token_file(path: &Path) -> Result<Token, TokenFileError> {
    let raw = std::fs::read(path).map_err(|source| TokenFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Token::from_file_contents(&raw).map_err(|source| TokenFileError::Invalid {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_read_or_refused_in_one_line_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        let e = read_token_file(&p).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("--token-file {}: cannot read it: ", p.display())),
            "{e}"
        );
        std::fs::write(&p, "short\n").unwrap();
        let e = read_token_file(&p).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("--token-file {}: ", p.display())),
            "{e}"
        );
        assert!(!e.contains("cannot read"), "{e}");
        std::fs::write(&p, "0123456789abcdef0123456789abcdef\n").unwrap();
        let t = read_token_file(&p).unwrap();
        let same = Token::from_file_contents(b"0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(t.key(), same.key());
    }
}
