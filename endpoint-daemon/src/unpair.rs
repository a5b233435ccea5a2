//! `byomd unpair`: deregister from the server, or learn that the server
//! already let this machine go (revoked it, or never heard of its
//! certificate), in which case wiping the local identity is all that is
//! left to do. `byomd status` recommends unpairing a revoked machine, so
//! that must work without `--force`.

use std::path::Path;

use byom_protocol::close;

use crate::identity::Identity;

/// How unpairing went on the server's side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unpaired {
    /// The server forgot the machine at our request.
    Deregistered,
    /// The server had already let it go; why, in a few words.
    AlreadyGone(String),
}

/// Asks the server to forget this machine. A machine the server revoked
/// (as it told the running daemon earlier, or tells us now) or does not
/// know is already gone there: that is not an error.
pub async fn deregister(dir: &Path, id: &Identity) -> anyhow::Result<Unpaired> {
    if id.revoked {
        // The server said so to the running daemon, and refuses this
        // certificate from then on: asking again cannot succeed.
        return Ok(Unpaired::AlreadyGone(
            "the server had already revoked this machine".into(),
        ));
    }
    match crate::conn::unpair(dir, id).await {
        Ok(()) => Ok(Unpaired::Deregistered),
        Err(e) => match e.chain().find_map(|c| c.downcast_ref()).and_then(gone) {
            Some(why) => Ok(Unpaired::AlreadyGone(why)),
            None => Err(e),
        },
    }
}

/// Whether a connection's end says the server is done with this machine,
/// and how to say it: its application close codes, or the TLS alert its
/// certificate verifier sends for a revoked certificate (44) or one its CA
/// did not issue (48, a server whose data was reset).
fn gone(e: &quinn::ConnectionError) -> Option<String> {
    match e {
        quinn::ConnectionError::ApplicationClosed(c) => {
            let code = c.error_code.into_inner();
            if code == u64::from(close::REVOKED) {
                Some("the server had already revoked this machine".into())
            } else if code == u64::from(close::UNKNOWN_MACHINE) {
                Some("the server does not know this machine (any more)".into())
            } else {
                None
            }
        }
        quinn::ConnectionError::ConnectionClosed(c)
            if c.error_code == quinn::TransportErrorCode::crypto(44) =>
        {
            Some("the server had already revoked this machine's certificate".into())
        }
        quinn::ConnectionError::ConnectionClosed(c)
            if c.error_code == quinn::TransportErrorCode::crypto(48) =>
        {
            Some("the server does not recognise this machine's certificate (its CA did not issue it)".into())
        }
        _ => None,
    }
}
