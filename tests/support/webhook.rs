//! A validating admission webhook on 127.0.0.1, registered with the real API server: a fault
//! injector that runs a test's action at the exact moment the API server admits a matching
//! request, before that request is stored. With it a test places another writer's change
//! between two of ginx's requests, deterministically (no timing, no sleeps).
//!
//! It always allows. `failurePolicy: Ignore` keeps every other test's requests going if it is
//! slow; its `matchConditions` select only the test's own objects.

use std::sync::{Arc, Mutex};

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Response};
use serde_json::{Value, json};

use super::control_plane::ControlPlane;
use super::tls::TestCa;
use super::wait_for;

type Action = dyn Fn(&Value) + Send + Sync;

pub struct Webhook<'a> {
    cp: &'a ControlPlane,
    name: String,
    probe: String,
    /// Every admission request's `request` object seen, in order.
    pub calls: Arc<Mutex<Vec<Value>>>,
    runtime: Option<tokio::runtime::Runtime>,
    _dir: tempfile::TempDir,
}

impl<'a> Webhook<'a> {
    /// Registers a webhook `name` for CREATE and UPDATE of Leases in `ginx-system` for which
    /// the CEL `condition` holds, calling `action` with each admission request (on a blocking
    /// thread) before allowing it. Returns once the API server calls it.
    pub fn leases(
        cp: &'a ControlPlane,
        name: &str,
        condition: &str,
        action: impl Fn(&Value) + Send + Sync + 'static,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new(dir.path());
        let acceptor = tokio_rustls::TlsAcceptor::from(ca.server_config());
        let (runtime, listener) = super::loopback_server(1);
        let port = listener.local_addr().unwrap().port();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let action: Arc<Action> = Arc::new(action);
        let probe = format!("webhook-probe-{name}");
        {
            let calls = Arc::clone(&calls);
            let probe = probe.clone();
            runtime.spawn(async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        continue;
                    };
                    let acceptor = acceptor.clone();
                    let calls = Arc::clone(&calls);
                    let action = Arc::clone(&action);
                    let probe = probe.clone();
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let svc = hyper::service::service_fn(move |req| {
                            let calls = Arc::clone(&calls);
                            let action = Arc::clone(&action);
                            let probe = probe.clone();
                            async move {
                                Ok::<_, std::convert::Infallible>(
                                    review(req, &calls, action, &probe).await,
                                )
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                            .await;
                    });
                }
            });
        }
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca.pem());
        let manifest = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": format!("ginx-test-{name}")},
            "webhooks": [{
                "name": format!("{name}.test.ginx.io"),
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/"), "caBundle": ca_bundle},
                "rules": [{
                    "apiGroups": ["coordination.k8s.io"],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["leases"],
                    "scope": "Namespaced",
                }],
                "matchConditions": [{
                    "name": "selected",
                    "expression": format!(
                        "object.metadata.namespace == 'ginx-system' && \
                         (object.metadata.name == '{probe}' || ({condition}))"
                    ),
                }],
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 15,
            }],
        });
        cp.apply(&manifest.to_string());
        let hook = Self {
            cp,
            name: name.to_owned(),
            probe: probe.clone(),
            calls,
            runtime: Some(runtime),
            _dir: dir,
        };
        // The API server picks a new configuration up asynchronously: write the probe Lease
        // until the webhook has seen it.
        let mut n = 0u32;
        wait_for(&format!("the API server calling webhook {name}"), || {
            n += 1;
            cp.apply(
                &json!({
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": probe, "namespace": "ginx-system"},
                    "spec": {"holderIdentity": format!("probe-{n}")},
                })
                .to_string(),
            );
            hook.calls
                .lock()
                .unwrap()
                .iter()
                .any(|c| c["name"] == probe.as_str())
                .then_some(())
        });
        hook
    }

    /// The admission requests seen for objects other than the probe.
    pub fn seen(&self) -> Vec<Value> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c["name"] != self.probe.as_str())
            .cloned()
            .collect()
    }
}

impl Drop for Webhook<'_> {
    fn drop(&mut self) {
        let _ = self.cp.kubectl_output(&[
            "delete",
            "validatingwebhookconfiguration",
            &format!("ginx-test-{}", self.name),
            "--ignore-not-found",
        ]);
        let _ = self.cp.kubectl_output(&[
            "delete",
            "lease",
            "-n",
            "ginx-system",
            &self.probe,
            "--ignore-not-found",
        ]);
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Answers one AdmissionReview: records it, runs the action (not for the probe), allows.
async fn review(
    req: Request<hyper::body::Incoming>,
    calls: &Mutex<Vec<Value>>,
    action: Arc<Action>,
    probe: &str,
) -> Response<Full<Bytes>> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let review: Value = serde_json::from_slice(&body).unwrap_or_default();
    let request = review["request"].clone();
    if request["name"] != probe {
        let r = request.clone();
        let _ = tokio::task::spawn_blocking(move || action(&r)).await;
    }
    calls.lock().unwrap().push(request.clone());
    let answer = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": request["uid"], "allowed": true},
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(answer.to_string())))
        .unwrap()
}
