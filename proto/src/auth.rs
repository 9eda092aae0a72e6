//! The client side of API keys: every call on a channel carries
//! `authorization: Bearer <key>`.

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::v1::shoal_client::ShoalClient;

/// Adds the key to every request (nothing without one).
#[derive(Clone, Debug, Default)]
pub struct BearerKey(Option<MetadataValue<Ascii>>);

impl BearerKey {
    /// `key`, which must be printable ASCII (keys made by
    /// `shoalctl keys new` are).
    pub fn new(key: Option<&str>) -> Result<Self, String> {
        let Some(key) = key.map(str::trim).filter(|k| !k.is_empty()) else { return Ok(BearerKey(None)) };
        let value = format!("Bearer {key}")
            .parse::<MetadataValue<Ascii>>()
            .map_err(|_| "the API key must be printable ASCII without line breaks".to_owned())?;
        Ok(BearerKey(Some(value)))
    }
}

impl Interceptor for BearerKey {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// A client of the public service that sends its key with every call.
pub type KeyedClient = ShoalClient<InterceptedService<Channel, BearerKey>>;
