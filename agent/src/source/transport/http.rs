//! The HTTP(S) transport: Git's smart HTTP protocol (gitprotocol-http(5)) carried by reqwest
//! on rustls, on the daemon's tokio runtime or one of the fetch's own.

use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use git2::transport::{Service, SmartSubtransport, SmartSubtransportStream};

use super::{only_fetch, percent_decode, timeout};
use crate::source::auth::Auth;

/// The tokio runtime a blocking fetch thread drives its requests on: the daemon's (fetches run
/// in `spawn_blocking`), else one of its own.
#[derive(Clone)]
enum Rt {
    Handle(tokio::runtime::Handle),
    Own(Arc<tokio::runtime::Runtime>),
}

impl Rt {
    fn new() -> io::Result<Self> {
        match tokio::runtime::Handle::try_current() {
            Ok(h) => Ok(Self::Handle(h)),
            Err(_) => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|r| Self::Own(Arc::new(r))),
        }
    }

    fn block_on<F: Future>(&self, f: F) -> F::Output {
        match self {
            Self::Handle(h) => h.block_on(f),
            Self::Own(r) => r.block_on(f),
        }
    }

    /// `f`, given up after the network timeout.
    fn wait<T>(&self, what: &str, f: impl Future<Output = T>) -> io::Result<T> {
        let t = timeout();
        self.block_on(async { tokio::time::timeout(t, f).await })
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{what}: no answer within {} s", t.as_secs_f64()),
                )
            })
    }
}

/// One remote's HTTP(S) connection state, shared by the streams of one fetch.
pub(super) struct Http {
    inner: Arc<HttpInner>,
}

struct HttpInner {
    rt: Rt,
    client: reqwest::Client,
    auth: Auth,
    state: Mutex<HttpState>,
}

#[derive(Default)]
struct HttpState {
    /// The repository's URL, without credentials: as configured, or where the first request
    /// was redirected to.
    base: Option<url::Url>,
    /// The configured host, the only one credentials are sent to.
    host: Option<(String, Option<u16>)>,
    /// `(user, password)`: from the URL as configured, else `token_file`.
    credentials: Option<(String, String)>,
    /// Whether the server asked for credentials (then every later request carries them).
    authenticate: bool,
}

const USER_AGENT: &str = concat!("git/2.0 (ginx ", env!("CARGO_PKG_VERSION"), ")");

impl Http {
    pub(super) fn new(auth: Auth) -> Result<Self, git2::Error> {
        let rt = Rt::new().map_err(|e| git2::Error::from_str(&format!("no runtime: {e}")))?;
        // rustls on ring, as for the other clients; installing it twice changes nothing.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(timeout())
            .user_agent(USER_AGENT)
            // A proxy from the environment is not ginx's (libgit2 used none either).
            .no_proxy()
            // The first request may be redirected (a renamed repository), never to plain HTTP;
            // a POST of the protocol is never redirected (it would become a GET).
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                let first = attempt.previous().first();
                if attempt.previous().len() > 5 {
                    attempt.error("more than 5 redirects")
                } else if first.is_some_and(|u| u.path().ends_with("/git-upload-pack")) {
                    attempt.stop()
                } else if first.is_some_and(|u| u.scheme() == "https")
                    && attempt.url().scheme() != "https"
                {
                    attempt.error("redirected from https:// to plain http://")
                } else {
                    attempt.follow()
                }
            }))
            .build()
            .map_err(|e| {
                git2::Error::from_str(&format!(
                    "cannot set up the HTTP client: {}",
                    crate::util::http_error(&e)
                ))
            })?;
        Ok(Self {
            inner: Arc::new(HttpInner {
                rt,
                client,
                auth,
                state: Mutex::new(HttpState::default()),
            }),
        })
    }
}

impl SmartSubtransport for Http {
    fn action(
        &self,
        url: &str,
        action: Service,
    ) -> Result<Box<dyn SmartSubtransportStream>, git2::Error> {
        only_fetch(action)?;
        self.inner
            .remember(url)
            .map_err(|e| git2::Error::from_str(&e))?;
        let mut stream = HttpStream {
            inner: Arc::clone(&self.inner),
            post: action == Service::UploadPack,
            body: Vec::new(),
            response: None,
            pending: Bytes::new(),
        };
        if !stream.post {
            stream.response = Some(
                self.inner
                    .request(false, Vec::new())
                    .map_err(|e| git2::Error::from_str(&e.to_string()))?,
            );
        }
        Ok(Box::new(stream))
    }

    fn close(&self) -> Result<(), git2::Error> {
        Ok(())
    }
}

impl HttpInner {
    /// Takes the repository's URL and the credentials from the URL libgit2 was given (the one
    /// configured), the first time.
    fn remember(&self, raw: &str) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.base.is_some() {
            return Ok(());
        }
        // The url crate's messages never echo the input, so no credential leaks here.
        let mut url = url::Url::parse(raw).map_err(|e| format!("invalid URL: {e}"))?;
        let from_url = url
            .password()
            .map(|p| (percent_decode(url.username()), percent_decode(p)));
        state.credentials = from_url.or_else(|| self.auth.token().cloned());
        let _ = url.set_username("");
        let _ = url.set_password(None);
        url.set_fragment(None);
        state.host = url.host_str().map(|h| (h.to_owned(), url.port()));
        state.base = Some(url);
        Ok(())
    }

    /// `base` + `/suffix`, its query kept and `extra` added to it.
    fn endpoint(base: &url::Url, suffix: &str, extra: Option<&str>) -> url::Url {
        let mut u = base.clone();
        let path = format!("{}/{suffix}", base.path().trim_end_matches('/'));
        u.set_path(&path);
        let query = [base.query(), extra]
            .into_iter()
            .flatten()
            .filter(|q| !q.is_empty())
            .collect::<Vec<_>>()
            .join("&");
        u.set_query((!query.is_empty()).then_some(query.as_str()));
        u
    }

    /// The advertisement (`post` false) or one round of negotiation (`post`, with `body`).
    /// Credentials are sent only after the configured host asks for them.
    fn request(&self, post: bool, body: Vec<u8>) -> io::Result<reqwest::Response> {
        let (base, host, credentials, mut authenticate) = {
            let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            (
                s.base.clone().ok_or_else(|| io::Error::other("no URL"))?,
                s.host.clone(),
                s.credentials.clone(),
                s.authenticate,
            )
        };
        let url = if post {
            Self::endpoint(&base, "git-upload-pack", None)
        } else {
            Self::endpoint(&base, "info/refs", Some("service=git-upload-pack"))
        };
        let same_host = url.host_str().map(|h| (h.to_owned(), url.port())) == host;
        loop {
            let mut req = self.build(post, &url, &body);
            if authenticate && let Some((user, password)) = &credentials {
                req = req.basic_auth(user, Some(password));
            }
            let resp = self.send(post, req)?;
            if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
                if credentials.is_some() && !authenticate && same_host {
                    authenticate = true;
                    self.state
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .authenticate = true;
                    continue;
                }
                return Err(unauthorized(&url, same_host, credentials.is_some()));
            }
            check_answer(post, &resp)?;
            if !post && resp.url().path().ends_with("/info/refs") && resp.url() != &url {
                // Redirected: the next requests go where the repository now is.
                let moved = moved_base(resp.url());
                tracing::info!(to = %shown(&moved), "the remote's URL redirects; following it for this fetch");
                self.state.lock().unwrap_or_else(|e| e.into_inner()).base = Some(moved);
            }
            return Ok(resp);
        }
    }

    /// The request for `url`: a GET of the advertisement, or a POST of `body` (`post`).
    fn build(&self, post: bool, url: &url::Url, body: &[u8]) -> reqwest::RequestBuilder {
        if post {
            self.client
                .post(url.clone())
                .header("Content-Type", "application/x-git-upload-pack-request")
                .header("Accept", "application/x-git-upload-pack-result")
                .body(body.to_vec())
        } else {
            self.client
                .get(url.clone())
                .header("Accept", "application/x-git-upload-pack-advertisement")
        }
    }

    /// Sends `req`, waiting at most the network timeout; an error says what the client saw
    /// (never the URL), with a hint when the server's certificate is not trusted.
    fn send(&self, post: bool, req: reqwest::RequestBuilder) -> io::Result<reqwest::Response> {
        let what = if post { "negotiation" } else { "request" };
        self.rt.wait(what, req.send())?.map_err(|e| {
            let said = crate::util::http_error(&e.without_url());
            io::Error::other(if said.contains("certificate") {
                format!(
                    "{said}; the server's certificate is not trusted: add its CA to the \
                     system's roots (or point SSL_CERT_FILE at a bundle that has it)"
                )
            } else {
                said
            })
        })
    }
}

/// Why a 401 ends the request: the credentials were withheld from another host, rejected, or
/// there are none.
fn unauthorized(url: &url::Url, same_host: bool, have_credentials: bool) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        if !same_host {
            format!(
                "authentication failed: redirected to {}, which asks for \
                 credentials; ginx sends them only to the host configured",
                url.host_str().unwrap_or("?")
            )
        } else if have_credentials {
            "authentication failed: the server rejected the configured credentials \
             (token_file)"
                .to_owned()
        } else {
            "authentication failed: the server requires authentication; configure \
             token_file"
                .to_owned()
        },
    )
}

/// The answer is a success in Git's smart HTTP protocol, of the kind asked for.
fn check_answer(post: bool, resp: &reqwest::Response) -> io::Result<()> {
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match answer_problem(post, resp.status(), content_type) {
        Some(why) => Err(io::Error::other(why)),
        None => Ok(()),
    }
}

/// What is wrong with an answer of `status` and `content_type` (not a 401, handled before);
/// `None` when it is the smart HTTP answer a GET (`post` false) or a POST expects.
fn answer_problem(post: bool, status: reqwest::StatusCode, content_type: &str) -> Option<String> {
    if !status.is_success() {
        let hint = match status.as_u16() {
            403 => " (check token_file and the deploy token's access)",
            404 => " (check the repository's URL)",
            _ => "",
        };
        return Some(format!("the server answered {status}{hint}"));
    }
    let wanted = if post {
        "application/x-git-upload-pack-result"
    } else {
        "application/x-git-upload-pack-advertisement"
    };
    (!content_type.starts_with(wanted)).then(|| {
        format!(
            "the server did not answer with Git's smart HTTP protocol (Content-Type \
             {content_type:?}, not {wanted}); is the URL a Git repository?"
        )
    })
}

/// The repository's URL after the advertisement at `answered` (`…/info/refs?service=…`) was
/// redirected there: without `/info/refs`, its other query parameters kept.
fn moved_base(answered: &url::Url) -> url::Url {
    let mut moved = answered.clone();
    let path = moved.path().trim_end_matches("/info/refs").to_owned();
    moved.set_path(&path);
    let query: Vec<String> = moved
        .query_pairs()
        .filter(|(k, _)| k != "service")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    moved.set_query((!query.is_empty()).then_some(query.join("&").as_str()));
    moved
}

/// A URL fit for a log: scheme, host and port only.
fn shown(u: &url::Url) -> String {
    match u.port() {
        Some(p) => format!("{}://{}:{p}/***", u.scheme(), u.host_str().unwrap_or("")),
        None => format!("{}://{}/***", u.scheme(), u.host_str().unwrap_or("")),
    }
}

/// One request: written (a POST's body) then read.
struct HttpStream {
    inner: Arc<HttpInner>,
    post: bool,
    body: Vec<u8>,
    response: Option<reqwest::Response>,
    pending: Bytes,
}

impl Read for HttpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pending.is_empty() {
            if self.response.is_none() {
                let body = std::mem::take(&mut self.body);
                self.response = Some(self.inner.request(self.post, body)?);
            }
            let Some(resp) = self.response.as_mut() else {
                return Ok(0);
            };
            match self.inner.rt.wait("reading the answer", resp.chunk())? {
                Ok(Some(chunk)) => self.pending = chunk,
                Ok(None) => return Ok(0),
                Err(e) => {
                    return Err(io::Error::other(crate::util::http_error(&e.without_url())));
                }
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending.split_to(n));
        Ok(n)
    }
}

impl Write for HttpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.post || self.response.is_some() {
            return Err(io::Error::other(
                "libgit2 wrote to an HTTP request already sent",
            ));
        }
        self.body.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn an_http_endpoint_keeps_the_query_and_adds_the_service() {
        let base = url::Url::parse("https://h.example/g/h.git?private=1").unwrap();
        assert_eq!(
            HttpInner::endpoint(&base, "info/refs", Some("service=git-upload-pack")).as_str(),
            "https://h.example/g/h.git/info/refs?private=1&service=git-upload-pack"
        );
        let base = url::Url::parse("https://h.example/g/h.git/").unwrap();
        assert_eq!(
            HttpInner::endpoint(&base, "git-upload-pack", None).as_str(),
            "https://h.example/g/h.git/git-upload-pack"
        );
    }

    #[test]
    fn a_redirected_advertisement_moves_the_repository_base() {
        let answered = url::Url::parse(
            "https://new.example/g/h.git/info/refs?private=1&service=git-upload-pack",
        )
        .unwrap();
        assert_eq!(
            moved_base(&answered).as_str(),
            "https://new.example/g/h.git?private=1"
        );
        let answered =
            url::Url::parse("https://new.example/h.git/info/refs?service=git-upload-pack").unwrap();
        assert_eq!(moved_base(&answered).as_str(), "https://new.example/h.git");
    }

    #[test]
    fn only_a_smart_http_success_of_the_kind_asked_for_is_an_answer() {
        use reqwest::StatusCode;
        let adv = "application/x-git-upload-pack-advertisement";
        let result = "application/x-git-upload-pack-result";
        assert_eq!(answer_problem(false, StatusCode::OK, adv), None);
        assert_eq!(answer_problem(true, StatusCode::OK, result), None);
        let not_git = answer_problem(false, StatusCode::OK, "text/html").unwrap();
        assert!(
            not_git.contains("is the URL a Git repository?"),
            "{not_git}"
        );
        assert!(answer_problem(true, StatusCode::OK, adv).is_some());
        assert_eq!(
            answer_problem(false, StatusCode::NOT_FOUND, adv).as_deref(),
            Some("the server answered 404 Not Found (check the repository's URL)")
        );
        assert_eq!(
            answer_problem(true, StatusCode::FORBIDDEN, result).as_deref(),
            Some(
                "the server answered 403 Forbidden (check token_file and the deploy token's access)"
            )
        );
    }
}
