//! Length-prefixed protobuf frames: a 4-byte big-endian length, then that
//! many bytes of one protobuf message.
//!
//! Split into header and body decoding so an async reader on any transport
//! can check the length against [`MAX_FRAME_BYTES`] before it allocates.
//! [`FrameDecoder`] does the same over an in-memory buffer.

use prost::Message;

use crate::limits::MAX_FRAME_BYTES;

/// Bytes of the length prefix.
pub const HEADER_BYTES: usize = 4;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("stream ended inside a frame ({have} of {want} bytes)")]
    Truncated { have: usize, want: usize },
}

/// Encodes `msg` as one frame.
pub fn encode<M: Message>(msg: &M) -> Result<Vec<u8>, FrameError> {
    let len = msg.encoded_len();
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len,
            max: MAX_FRAME_BYTES,
        });
    }
    let mut out = Vec::with_capacity(HEADER_BYTES + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    msg.encode(&mut out)
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    Ok(out)
}

/// Reads the body length from a header, refusing lengths over the limit.
pub fn decode_header(header: [u8; HEADER_BYTES]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len,
            max: MAX_FRAME_BYTES,
        });
    }
    Ok(len)
}

/// Decodes a frame body.
pub fn decode_body<M: Message + Default>(body: &[u8]) -> Result<M, FrameError> {
    M::decode(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Incremental decoder over bytes arriving in arbitrary pieces.
#[derive(Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes. The buffer never holds more than one frame
    /// plus what was pushed, and `next` fails fast on an oversized header.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Returns the next complete frame, `None` if more bytes are needed.
    pub fn next_frame<M: Message + Default>(&mut self) -> Result<Option<M>, FrameError> {
        if self.buf.len() < HEADER_BYTES {
            return Ok(None);
        }
        let mut header = [0u8; HEADER_BYTES];
        header.copy_from_slice(&self.buf[..HEADER_BYTES]);
        let len = decode_header(header)?;
        if self.buf.len() < HEADER_BYTES + len {
            return Ok(None);
        }
        let msg = decode_body(&self.buf[HEADER_BYTES..HEADER_BYTES + len]);
        self.buf.drain(..HEADER_BYTES + len);
        msg.map(Some)
    }

    /// Call at end of input: leftover bytes mean the peer stopped mid-frame.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let want = if self.buf.len() >= HEADER_BYTES {
            let mut header = [0u8; HEADER_BYTES];
            header.copy_from_slice(&self.buf[..HEADER_BYTES]);
            HEADER_BYTES + u32::from_be_bytes(header) as usize
        } else {
            HEADER_BYTES
        };
        Err(FrameError::Truncated {
            have: self.buf.len(),
            want,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{self, to_daemon, to_server, ToDaemon, ToServer};
    use proptest::prelude::*;

    fn output(data: Vec<u8>, offset: u64) -> ToServer {
        ToServer {
            msg: Some(to_server::Msg::Output(pb::Output {
                stream: pb::OutputStream::Stdout as i32,
                offset,
                data,
            })),
        }
    }

    #[test]
    fn round_trip_and_limits() {
        let msg = output(b"hello".to_vec(), 7);
        let bytes = encode(&msg).unwrap();
        let mut d = FrameDecoder::new();
        d.push(&bytes[..3]);
        assert_eq!(d.next_frame::<ToServer>().unwrap(), None);
        d.push(&bytes[3..]);
        assert_eq!(d.next_frame::<ToServer>().unwrap(), Some(msg));
        d.finish().unwrap();

        let big = output(vec![0u8; MAX_FRAME_BYTES + 1], 0);
        assert!(matches!(encode(&big), Err(FrameError::TooLarge { .. })));

        let mut d = FrameDecoder::new();
        d.push(&u32::MAX.to_be_bytes());
        assert!(matches!(
            d.next_frame::<ToServer>(),
            Err(FrameError::TooLarge { .. })
        ));
    }

    #[test]
    fn malformed_body_is_an_error() {
        let mut d = FrameDecoder::new();
        d.push(&3u32.to_be_bytes());
        d.push(&[0xff, 0xff, 0xff]);
        assert!(matches!(
            d.next_frame::<ToDaemon>(),
            Err(FrameError::Malformed(_))
        ));
    }

    proptest! {
        #[test]
        fn random_input_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let mut d = FrameDecoder::new();
            d.push(&bytes);
            for _ in 0..64 {
                match d.next_frame::<ToServer>() {
                    Ok(Some(_)) => continue,
                    _ => break,
                }
            }
            let _ = d.finish();
            let mut d = FrameDecoder::new();
            d.push(&bytes);
            let _ = d.next_frame::<ToDaemon>();
        }

        #[test]
        fn round_trip_any_split(data in proptest::collection::vec(any::<u8>(), 0..2048),
                                offset in any::<u64>(),
                                split in 0usize..4096,
                                n in 1usize..4) {
            let msgs: Vec<ToServer> = (0..n).map(|i| output(data.clone(), offset.wrapping_add(i as u64))).collect();
            let mut bytes = Vec::new();
            for m in &msgs { bytes.extend(encode(m).unwrap()); }
            let split = split.min(bytes.len());
            let mut d = FrameDecoder::new();
            d.push(&bytes[..split]);
            let mut got = Vec::new();
            while let Some(m) = d.next_frame::<ToServer>().unwrap() { got.push(m); }
            d.push(&bytes[split..]);
            while let Some(m) = d.next_frame::<ToServer>().unwrap() { got.push(m); }
            prop_assert_eq!(got, msgs);
            prop_assert!(d.finish().is_ok());
        }

        #[test]
        fn truncated_frames_are_reported(data in proptest::collection::vec(any::<u8>(), 1..512), cut in 1usize..512) {
            let msg = ToDaemon { msg: Some(to_daemon::Msg::Exec(pb::ExecRequest { command_id: "cmd_x".into(), shell: String::from_utf8_lossy(&data).into_owned(), ..Default::default() })) };
            let bytes = encode(&msg).unwrap();
            let cut = cut.min(bytes.len() - 1);
            let mut d = FrameDecoder::new();
            d.push(&bytes[..cut]);
            prop_assert_eq!(d.next_frame::<ToDaemon>().unwrap(), None);
            let truncated = matches!(d.finish(), Err(FrameError::Truncated { .. }));
            prop_assert!(truncated);
        }
    }
}
