//! Record batches as a producer (or a corrupted disk) might send them: the header view,
//! validation, the records under every codec, and a sequence of batches.
//!
//! Input: `[flags: u8][batch bytes…]`. Flag bit 0 rewrites the CRC to match, so that the
//! fuzzer gets past validation into the records; bits 1-3, when bit 4 is set, overwrite
//! the codec bits of the attributes (0-4, 5-7 invalid), so that every decompressor sees
//! the payload. Checks: no panic and no records beyond the decompression cap.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rill_protocol::records::RecordBatch;

/// The most a batch may decompress to here; small so that bombs are cheap to find.
const CAP: usize = 1 << 20;
const ATTRIBUTES_OFFSET: usize = 21;
const CRC_OFFSET: usize = 17;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    if flags & 0x10 != 0 && bytes.len() > ATTRIBUTES_OFFSET + 1 {
        let codec = (flags >> 1) & 0x7;
        bytes[ATTRIBUTES_OFFSET + 1] = (bytes[ATTRIBUTES_OFFSET + 1] & !0x7) | codec;
    }
    if flags & 1 != 0 && bytes.len() >= ATTRIBUTES_OFFSET {
        let crc = crc32c::crc32c(&bytes[ATTRIBUTES_OFFSET..]);
        bytes[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    }
    let bytes = Bytes::from(bytes);

    if let Ok(batch) = RecordBatch::new(bytes.clone()) {
        let _ = batch.validate();
        let _ = (
            batch.last_offset(),
            batch.next_offset(),
            batch.last_sequence(),
        );
        let _ = batch.compression();
        if let Ok(records) = batch.records(CAP) {
            assert!(records.len() <= CAP, "more records than bytes");
            let total: usize = records
                .iter()
                .map(|r| {
                    r.key.as_ref().map_or(0, |k| k.len()) + r.value.as_ref().map_or(0, |v| v.len())
                })
                .sum();
            assert!(total <= CAP, "records hold {total} bytes past the cap");
        }
        if let Ok(iter) = batch.record_iter(CAP) {
            for r in iter.take(1 << 16) {
                if r.is_err() {
                    break;
                }
            }
        }
    }

    // The same bytes as a records field holding several batches.
    for batch in RecordBatch::iter(bytes).take(64) {
        match batch {
            Ok(b) => {
                let _ = b.validate();
                let _ = b.records(CAP);
            }
            Err(_) => break,
        }
    }
});
