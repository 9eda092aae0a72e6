//! Any gRPC tool can find its way: reflection lists the services (what
//! `grpcurl list` uses) and the standard health service answers.

use tokio_stream::StreamExt;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_and_health_are_served() {
    let tc = cluster(1).await;
    let channel = tonic::transport::Endpoint::from_shared(tc.cluster.endpoint()).unwrap().connect().await.unwrap();
    let mut refl = ServerReflectionClient::new(channel.clone());
    let req = ServerReflectionRequest { host: String::new(), message_request: Some(MessageRequest::ListServices(String::new())) };
    let mut answers = refl.server_reflection_info(tokio_stream::iter(vec![req])).await.unwrap().into_inner();
    let Some(Ok(answer)) = answers.next().await else { panic!("no reflection answer") };
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else { panic!("unexpected answer") };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains(&"shoal.v1.Shoal".to_string()), "{names:?}");
    assert!(names.contains(&"grpc.health.v1.Health".to_string()), "{names:?}");

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health.check(tonic_health::pb::HealthCheckRequest { service: "shoal.v1.Shoal".into() }).await.unwrap().into_inner();
    assert_eq!(status.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);

    // The descriptor set shoalctl exports describes the same services.
    let fds = <prost_types::FileDescriptorSet as prost::Message>::decode(shoal_proto::FILE_DESCRIPTOR_SET).unwrap();
    let services: Vec<&str> = fds.file.iter().flat_map(|f| &f.service).filter_map(|s| s.name.as_deref()).collect();
    assert_eq!(services, ["Shoal", "ShardNode"]);
    tc.cluster.shutdown().await.unwrap();
}
