//! The frame reader over a byte stream cut into arbitrary reads.
//!
//! Input: `[cap: u16][cut lengths: 8 × u8][stream…]`. The stream is fed to `decode_frame`
//! in reads of the cut lengths (cycled), as a socket would deliver it. Checks: no panic;
//! no frame over the cap; the frames returned, with their prefixes, are exactly the bytes
//! consumed; and every frame's header decodes or fails cleanly.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use rill_protocol::{decode_frame, decode_request_header};

fuzz_target!(|data: &[u8]| {
    if data.len() < 10 {
        return;
    }
    let cap = usize::from(u16::from_be_bytes([data[0], data[1]]));
    let cuts: Vec<usize> = data[2..10].iter().map(|c| usize::from(*c).max(1)).collect();
    let stream = &data[10..];

    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut consumed = 0;
    let mut i = 0;
    'feed: while fed < stream.len() {
        let n = cuts[i % cuts.len()].min(stream.len() - fed);
        i += 1;
        buf.extend_from_slice(&stream[fed..fed + n]);
        fed += n;
        loop {
            match decode_frame(&mut buf, cap) {
                Ok(Some(frame)) => {
                    assert!(
                        frame.len() <= cap,
                        "frame of {} over cap {cap}",
                        frame.len()
                    );
                    let prefix = (frame.len() as u32).to_be_bytes();
                    assert_eq!(&stream[consumed..consumed + 4], &prefix);
                    assert_eq!(
                        &stream[consumed + 4..consumed + 4 + frame.len()],
                        &frame[..]
                    );
                    consumed += 4 + frame.len();
                    let _ = decode_request_header(&mut frame.freeze());
                }
                Ok(None) => {
                    // Waiting for more: what is buffered is one partial frame, never more.
                    assert_eq!(buf.len(), fed - consumed);
                    assert!(buf.len() < 4 + cap || buf.len() < 4);
                    break;
                }
                Err(_) => break 'feed,
            }
        }
    }
});
