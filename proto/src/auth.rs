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
        let refused = || "the API key must be printable ASCII without line breaks".to_owned();
        // A header value may also hold bytes above ASCII, but the
        // coordinator reads the header as ASCII and refuses such a key on
        // every call: say so here, once, instead.
        if !key.is_ascii() {
            return Err(refused());
        }
        let value = format!("Bearer {key}").parse::<MetadataValue<Ascii>>().map_err(|_| refused())?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_the_coordinator_could_not_read_is_refused_here() {
        assert!(BearerKey::new(None).unwrap().0.is_none());
        assert!(BearerKey::new(Some("  ")).unwrap().0.is_none(), "blank: no header");
        let k = BearerKey::new(Some(" shoal_0123abc\n")).unwrap();
        assert_eq!(k.0.unwrap().to_str().unwrap(), "Bearer shoal_0123abc");
        for bad in ["shoal_s\u{e9}cret", "shoal_se\ncret", "shoal_se\u{7f}cret"] {
            assert!(BearerKey::new(Some(bad)).is_err(), "{bad:?}");
        }
    }
}
