//! The dashboard (docs/conformance.md#listings) at `/ui`: plain HTML, CSS and JavaScript modules with no
//! build step, embedded in the binary (building or running it never needs Node.js). The
//! page signs in with an API key kept in the tab's `sessionStorage` and calls the same
//! API as any client; it renders API data with `textContent` only, and every answer
//! carries a strict Content-Security-Policy (same-origin scripts, styles and requests;
//! no inline code, no frames, no external fonts or CDNs).

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The policy of every dashboard answer.
pub const UI_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The embedded files: (name, content type, bytes).
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../ui/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/app.js"),
    ),
    (
        "api.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/api.js"),
    ),
    (
        "dom.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/dom.js"),
    ),
    (
        "pages.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/pages.js"),
    ),
    (
        "chat.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/chat.js"),
    ),
    (
        "webhooks.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/webhooks.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../ui/style.css"),
    ),
    ("icon.svg", "image/svg+xml", include_str!("../ui/icon.svg")),
];

pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        // A browser pointed at the server's root lands on the dashboard.
        .route(
            "/",
            get(|| async { axum::response::Redirect::temporary("/ui") }),
        )
        .route(
            "/ui",
            get(|| async { asset("index.html") }).fallback(wrong_method),
        )
        .route(
            "/ui/",
            get(|| async { asset("index.html") }).fallback(wrong_method),
        )
        .route(
            "/ui/{file}",
            get(|Path(file): Path<String>| async move { asset(&file) }).fallback(wrong_method),
        )
        // Every answer of these routes, a 404 for a missing file or a 405 for a wrong
        // method included, carries the pages' headers. (The 405 is this module's own: the
        // API's method-not-allowed fallback would replace a layered default one.)
        .layer(axum::middleware::map_response(page_headers))
}

async fn wrong_method() -> Response {
    crate::ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "the dashboard's files are only read (GET)",
    )
    .into_response()
}

fn asset(name: &str) -> Response {
    let Some((_, content_type, body)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return crate::ApiError::not_found("file").into_response();
    };
    let mut response = (StatusCode::OK, *body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The headers of every dashboard answer: the policy, no sniffing, no framing, no
/// referrer, and revalidation of the embedded files.
async fn page_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(UI_CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
