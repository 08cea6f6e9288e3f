//! What the viewer shows of a rollout (`GET /v1/rollouts/{id}/samples`,
//! `agl-gateway`'s `SampleViewer`): the samples the run's adapter builds,
//! decoded with the policy's tokenizer, and the reward as the run scores
//! it (the reward plugin, else the harness's own `reward` event). Served
//! by `agl run`'s gateway and by `agl serve` when `plugins.adapter` is set.

use std::sync::Arc;

use axum::http::StatusCode;

use crate::plugins::{Plugins, score};
use agl_gateway::{PluginFuture, SampleViewer};
use agl_tokenizer::Tokenizer;
use agl_wire::ApiError;
use agl_wire::api::{SampleList, SampleView};
use agl_wire::rollout::Rollout;

pub struct Viewer {
    pub plugins: Arc<Plugins>,
    pub tokenizer: Option<Arc<Tokenizer>>,
}

impl SampleViewer for Viewer {
    fn samples(&self, rollout: Rollout) -> PluginFuture<'_, SampleList> {
        Box::pin(async move {
            let rollout = Arc::new(rollout);
            let (adapter, reward) = (self.plugins.adapter(), self.plugins.reward());
            let built = adapter.build_samples(&rollout).await.map_err(|e| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request_error",
                    format!(
                        "adapter `{}` failed on rollout {}: {e}",
                        adapter.name(),
                        rollout.id
                    ),
                )
            })?;
            let decode = |ids: &[u32]| match &self.tokenizer {
                Some(t) => t.decode(ids, false).unwrap_or_default(),
                None => String::new(),
            };
            let samples: Vec<SampleView> = built
                .iter()
                .enumerate()
                .map(|(i, s)| SampleView::of(i, s, &decode))
                .collect();
            let name = |p: &agl_plugin_host::Plugin| format!("{} {}", p.name(), p.info().version);
            let (reward_value, reward_error) = match score(reward.as_ref(), &rollout).await {
                Ok(v) => (v, None),
                Err(e) => (None, Some(e.to_string())),
            };
            Ok(SampleList {
                rollout_id: rollout.id.clone(),
                adapter: name(&adapter),
                reward: reward_value,
                reward_source: reward.as_ref().map_or_else(|| "harness".to_string(), name),
                reward_error,
                trained_tokens: samples.iter().map(|s| s.trained_tokens).sum(),
                samples,
            })
        })
    }
}
