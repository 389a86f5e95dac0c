//! ApiVersions: which APIs and versions this broker speaks.

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::{Api, ApiVersionRange, ApiVersionRangeArgs, ApiVersionsResponse, ApiVersionsResponseArgs};

use super::respond;
use crate::shard::messages::WireError;

pub fn handle(header: FrameHeader) -> Result<OutFrame, WireError> {
    let mut fbb = FlatBufferBuilder::new();
    let ranges: Vec<_> = Api::ALL
        .iter()
        .map(|api| {
            let (min_version, max_version) = api.versions();
            ApiVersionRange::create(
                &mut fbb,
                &ApiVersionRangeArgs {
                    api: *api as u16,
                    min_version,
                    max_version,
                },
            )
        })
        .collect();
    let apis = fbb.create_vector(&ranges);
    let root = ApiVersionsResponse::create(
        &mut fbb,
        &ApiVersionsResponseArgs {
            error: None,
            apis: Some(apis),
        },
    );
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}
