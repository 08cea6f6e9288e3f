//! The policies gateway-rendering engines render with: the gateway's own
//! (`[model]` of its config, see [`crate::Gateway::with_policy`]) and the
//! folders engines name at registration (`policy`), each loaded once. An
//! engine's row in the store names its folder, so a restarted gateway
//! renders for it again without a new registration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use agl_conversation::Renderer;
use agl_store::Engine;

use crate::ApiError;

#[derive(Default)]
pub struct Policies {
    /// The gateway's own policy, for engines that name none.
    own: Option<Arc<Renderer>>,
    /// Policy folders engines named, by their canonical path.
    folders: Mutex<HashMap<String, Arc<Renderer>>>,
}

impl Policies {
    pub fn with_own(renderer: Renderer) -> Policies {
        Policies {
            own: Some(Arc::new(renderer)),
            folders: Mutex::default(),
        }
    }

    pub fn has_own(&self) -> bool {
        self.own.is_some()
    }

    /// The policy in `folder` (a canonical path), loaded on first use off
    /// the async workers.
    pub async fn folder(&self, folder: &str) -> Result<Arc<Renderer>, ApiError> {
        let loaded = |p: &Policies| {
            p.folders
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(folder)
                .cloned()
        };
        if let Some(r) = loaded(self) {
            return Ok(r);
        }
        let dir = std::path::PathBuf::from(folder);
        let renderer = tokio::task::spawn_blocking(move || Renderer::from_folder(&dir))
            .await
            .map_err(|e| ApiError::internal(format!("loading policy {folder}: {e}")))?
            .map_err(|e| {
                ApiError::unavailable(format!("cannot load the policy folder {folder}: {e}"))
            })?;
        let renderer = Arc::new(renderer);
        self.folders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(folder.to_owned(), renderer.clone());
        Ok(renderer)
    }

    /// What `engine` (registered with `render = "gateway"`) renders with.
    pub async fn for_engine(&self, engine: &Engine) -> Result<Arc<Renderer>, ApiError> {
        match &engine.policy {
            Some(folder) => self.folder(folder).await,
            None => self.own.clone().ok_or_else(|| {
                ApiError::unavailable(format!(
                    "engine `{}` renders on the gateway with the gateway's own policy, but this \
                     gateway has none (model.path in its config); register it with `policy`",
                    engine.name
                ))
            }),
        }
    }
}
