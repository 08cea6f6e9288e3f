//! `/v1/plugins`: the plugins a hosting `agl run` trains with, and swapping
//! one while the run goes (admin only). The gateway does not load plugins
//! itself: the process that hosts it registers a [`PluginAdmin`]; without
//! one (a plain `agl serve`) the routes answer 404.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::header::CONTENT_TYPE;
use axum::response::Json;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery};
use agl_wire::api::{
    LoadedPlugin, PluginList, PluginPath, PluginRole, SwapPlugin, SwapPluginQuery,
};
use agl_wire::error::ErrorBody;

/// Where a new plugin comes from.
#[derive(Debug, Clone)]
pub enum PluginSource {
    /// A file on the machine the run is on.
    Path(PathBuf),
    /// The component's bytes.
    Wasm(Bytes),
}

pub type PluginFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ApiError>> + Send + 'a>>;

/// What the process hosting the gateway does with a plugin request.
pub trait PluginAdmin: Send + Sync {
    /// The plugins serving now.
    fn current(&self) -> Vec<LoadedPlugin>;

    /// Loads `source` for `role` and swaps it in; on any failure the old
    /// plugin keeps serving and the error says why.
    fn swap(
        &self,
        role: PluginRole,
        source: PluginSource,
        name: Option<String>,
    ) -> PluginFuture<'_, LoadedPlugin>;
}

pub type SharedPluginAdmin = Arc<dyn PluginAdmin>;

fn admin(st: &AppState) -> Result<&SharedPluginAdmin, ApiError> {
    st.plugins.as_ref().ok_or_else(|| {
        ApiError::not_found("no run is hosting plugins on this gateway (start it with `agl run`)")
    })
}

/// The plugins the hosting run trains with.
#[utoipa::path(
    get,
    path = "/v1/plugins",
    operation_id = "list_plugins",
    tag = "plugins",
    security(("admin_key" = [])),
    responses(
        (status = 200, description = "The plugin of each role.", body = PluginList),
        (status = 404, description = "No run hosts plugins here (`agl serve`).",
         body = ErrorBody),
    ),
)]
pub async fn list(State(st): State<AppState>) -> Result<Json<PluginList>, ApiError> {
    Ok(Json(PluginList {
        plugins: admin(&st)?.current(),
    }))
}

/// Swap the plugin of a role while the run goes.
///
/// `application/wasm` (or `application/octet-stream`) bodies are the
/// component; anything else is a JSON [`SwapPlugin`]. The new plugin is
/// loaded and validated first: on any failure the old one keeps serving.
#[utoipa::path(
    post,
    path = "/v1/plugins/{role}",
    operation_id = "swap_plugin",
    tag = "plugins",
    security(("admin_key" = [])),
    params(PluginPath, SwapPluginQuery),
    request_body(content(
        (SwapPlugin = "application/json"),
        (Vec<u8> = "application/wasm"),
    )),
    responses(
        (status = 200, description = "The plugin now serving the role.", body = LoadedPlugin),
        (status = 404, description = "No such role, or no run hosts plugins here.",
         body = ErrorBody),
        (status = 400, description = "A body that is neither, or a plugin that does not load \
            or validate (the old one keeps serving).", body = ErrorBody),
    ),
)]
pub async fn swap(
    State(st): State<AppState>,
    ApiPath(PluginPath { role }): ApiPath<PluginPath>,
    ApiQuery(q): ApiQuery<SwapPluginQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<LoadedPlugin>, ApiError> {
    let role = PluginRole::parse(&role).ok_or_else(|| {
        ApiError::not_found(format!("no plugin role `{role}` (adapter | reward)"))
    })?;
    let admin = admin(&st)?;
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let binary = ["application/wasm", "application/octet-stream"]
        .iter()
        .any(|t| content_type.starts_with(t));
    let (source, name) = if binary {
        (PluginSource::Wasm(body), q.name)
    } else {
        let req: SwapPlugin = serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "expected {{\"path\": ...}} or an application/wasm body: {e}"
            ))
        })?;
        let path = req
            .path
            .ok_or_else(|| ApiError::bad_request("`path` is required"))?;
        (PluginSource::Path(PathBuf::from(path)), req.name.or(q.name))
    };
    Ok(Json(admin.swap(role, source, name).await?))
}
