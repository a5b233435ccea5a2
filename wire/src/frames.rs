//! Frame I/O on QUIC streams, on top of the codec in `byom_protocol::frame`.
//! The length is checked before the body is read, so an oversized frame
//! costs the reader nothing.

use byom_protocol::frame::{self, FrameError, HEADER_BYTES};
use prost::Message;

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("stream read failed: {0}")]
    Read(#[from] quinn::ReadExactError),
    #[error("stream write failed: {0}")]
    Write(#[from] quinn::WriteError),
    #[error("stream closed: {0}")]
    Closed(#[from] quinn::ClosedStream),
}

/// Reads one frame; `None` when the peer finished the stream between frames.
pub async fn read_frame<M: Message + Default>(
    recv: &mut quinn::RecvStream,
) -> Result<Option<M>, WireError> {
    let mut header = [0u8; HEADER_BYTES];
    match recv.read_exact(&mut header).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(quinn::ReadExactError::FinishedEarly(n)) => {
            return Err(FrameError::Truncated {
                have: n,
                want: HEADER_BYTES,
            }
            .into())
        }
        Err(e) => return Err(e.into()),
    }
    let len = frame::decode_header(header)?;
    let mut body = vec![0u8; len];
    match recv.read_exact(&mut body).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(n)) => {
            return Err(FrameError::Truncated { have: n, want: len }.into())
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Some(frame::decode_body(&body)?))
}

pub async fn write_frame<M: Message>(
    send: &mut quinn::SendStream,
    msg: &M,
) -> Result<(), WireError> {
    let bytes = frame::encode(msg)?;
    send.write_all(&bytes).await?;
    Ok(())
}
