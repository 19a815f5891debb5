//! The generated `visit_error_codes`: every `ErrorCode` of a response, nested ones
//! included, which the broker counts for `ErrorsPerSec`.

use rill_protocol::generated::create_topics_response::{
    CreatableTopicResult, CreateTopicsResponse,
};
use rill_protocol::generated::metadata_response::{
    MetadataResponse, MetadataResponsePartition, MetadataResponseTopic,
};
use rill_protocol::generated::ResponseBody;

fn codes(body: &ResponseBody) -> Vec<i16> {
    let mut out = Vec::new();
    body.visit_error_codes(&mut |c| out.push(c));
    out
}

#[test]
fn nested_error_codes_are_visited_in_field_order() {
    let partition = |code| MetadataResponsePartition {
        error_code: code,
        ..Default::default()
    };
    let metadata = MetadataResponse {
        topics: vec![
            MetadataResponseTopic {
                error_code: 3,
                partitions: vec![partition(0), partition(5)],
                ..Default::default()
            },
            MetadataResponseTopic {
                error_code: 0,
                partitions: vec![partition(6)],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    // The top-level error code (version 13, KIP-1102) comes last in the spec's field order.
    assert_eq!(codes(&ResponseBody::from(metadata)), vec![3, 0, 5, 0, 6, 0]);

    let created = CreateTopicsResponse {
        topics: vec![CreatableTopicResult {
            error_code: 36,
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(codes(&ResponseBody::from(created)), vec![36]);
}
