//! Test helper: assembles valid uncompressed magic-2 record batches.

use rill_protocol::records::batch::{HEADER_LEN, LOG_OVERHEAD};

fn put_varlong(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// A batch description; `build` lays it out with a correct CRC32C.
#[derive(Debug, Clone)]
pub struct TestBatch {
    /// One timestamp per record.
    pub timestamps: Vec<i64>,
    pub value_len: usize,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub attributes: i16,
    pub base_offset: i64,
    pub leader_epoch: i32,
}

impl TestBatch {
    /// `n` records with timestamps `ts, ts+1, …`.
    pub fn new(n: usize, ts: i64) -> Self {
        Self {
            timestamps: (0..n as i64).map(|i| ts + i).collect(),
            value_len: 10,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            attributes: 0,
            base_offset: 0,
            leader_epoch: -1,
        }
    }
    pub fn value_len(mut self, len: usize) -> Self {
        self.value_len = len;
        self
    }
    pub fn producer(mut self, id: i64, epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = id;
        self.producer_epoch = epoch;
        self.base_sequence = base_sequence;
        self
    }
    pub fn control(mut self) -> Self {
        self.attributes |= 0x20;
        self
    }
    pub fn at(mut self, base_offset: i64, leader_epoch: i32) -> Self {
        self.base_offset = base_offset;
        self.leader_epoch = leader_epoch;
        self
    }

    pub fn build(&self) -> Vec<u8> {
        let base_ts = self.timestamps.first().copied().unwrap_or(-1);
        let max_ts = self.timestamps.iter().copied().max().unwrap_or(-1);
        let mut records = Vec::new();
        for (i, ts) in self.timestamps.iter().enumerate() {
            let mut body = vec![0u8]; // attributes
            put_varlong(&mut body, ts - base_ts);
            put_varlong(&mut body, i as i64);
            put_varlong(&mut body, -1); // null key
            put_varlong(&mut body, self.value_len as i64);
            body.extend(std::iter::repeat_n(i as u8, self.value_len));
            put_varlong(&mut body, 0); // headers
            put_varlong(&mut records, body.len() as i64);
            records.extend_from_slice(&body);
        }
        let n = self.timestamps.len() as i32;
        let mut b = Vec::with_capacity(HEADER_LEN + records.len());
        b.extend_from_slice(&self.base_offset.to_be_bytes());
        b.extend_from_slice(&((HEADER_LEN - LOG_OVERHEAD + records.len()) as i32).to_be_bytes());
        b.extend_from_slice(&self.leader_epoch.to_be_bytes());
        b.push(2);
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&self.attributes.to_be_bytes());
        b.extend_from_slice(&(n - 1).to_be_bytes());
        b.extend_from_slice(&base_ts.to_be_bytes());
        b.extend_from_slice(&max_ts.to_be_bytes());
        b.extend_from_slice(&self.producer_id.to_be_bytes());
        b.extend_from_slice(&self.producer_epoch.to_be_bytes());
        b.extend_from_slice(&self.base_sequence.to_be_bytes());
        b.extend_from_slice(&n.to_be_bytes());
        b.extend_from_slice(&records);
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    pub fn bytes(&self) -> bytes::Bytes {
        bytes::Bytes::from(self.build())
    }
}
