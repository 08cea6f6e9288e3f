//! Every route the gateway serves, in one list: each is mounted with
//! `utoipa_axum`'s `routes!`, which takes the path and methods from the
//! handler's `#[utoipa::path]`, so a route cannot be served without being
//! described (`openapi/`), and the description names no route the router
//! lacks. `tests/gateway/openapi.rs` checks the built router against the
//! served document.

use axum::middleware::from_fn_with_state;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{
    AppState, auth, engines, events, openapi, plugins, proxy, proxy_admin, rollouts, service,
    viewer, weights,
};

/// The routes, with the auth each group of them takes.
pub fn all(st: &AppState) -> OpenApiRouter<AppState> {
    let admin = OpenApiRouter::new()
        .routes(routes!(rollouts::create, rollouts::list))
        .routes(routes!(rollouts::get, rollouts::patch))
        .routes(routes!(rollouts::cancel))
        .routes(routes!(rollouts::retry))
        .routes(routes!(rollouts::export))
        .routes(routes!(viewer::samples))
        .routes(routes!(rollouts::changes))
        .routes(routes!(engines::register, engines::list))
        .routes(routes!(engines::remove))
        .routes(routes!(proxy_admin::pause))
        .routes(routes!(proxy_admin::resume))
        .routes(routes!(proxy_admin::drain))
        .routes(routes!(proxy_admin::state))
        .routes(routes!(weights::latest, weights::record))
        .routes(routes!(plugins::list))
        .routes(routes!(plugins::swap))
        .routes(routes!(viewer::steps))
        .route_layer(from_fn_with_state(st.clone(), auth::require_admin));
    // The admin, or the agent of the rollout in the path.
    let agent = OpenApiRouter::new()
        .routes(routes!(events::append, events::list))
        .route_layer(from_fn_with_state(st.clone(), auth::require_rollout_access));
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(service::healthz))
        .routes(routes!(service::metrics))
        .routes(routes!(openapi::document))
        .routes(routes!(viewer::page))
        .routes(routes!(viewer::script))
        .routes(routes!(viewer::style))
        .merge(admin)
        .merge(agent)
        .merge(proxy::routes())
}
