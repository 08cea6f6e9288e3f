//! Generated bindings for both worlds. The `sample-adapter` world owns every
//! interface; the `reward` world reuses them through `with`, so one set of
//! Rust types serves both (a `Rollout` is a `Rollout` whichever plugin kind
//! you write).

/// Bindings of world `sample-adapter`.
#[allow(clippy::too_many_arguments)] // generated ABI shims
pub mod adapter {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "sample-adapter",
        pub_export_macro: true,
        default_bindings_module: "agl_plugin::bindings::adapter",
        export_macro_name: "export_sample_adapter",
        additional_derives: [PartialEq],
    });
}

/// Bindings of world `reward`, sharing `adapter`'s interfaces.
#[allow(clippy::too_many_arguments)] // generated ABI shims
pub mod reward {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "reward",
        with: {
            "agl:adapter/types@0.6.0": crate::bindings::adapter::agl::adapter::types,
            "agl:adapter/log@0.6.0": crate::bindings::adapter::agl::adapter::log,
            "agl:adapter/config@0.6.0": crate::bindings::adapter::agl::adapter::config,
            "agl:adapter/tokenizer@0.6.0": crate::bindings::adapter::agl::adapter::tokenizer,
            "agl:adapter/rollout-data@0.6.0": crate::bindings::adapter::agl::adapter::rollout_data,
        },
        pub_export_macro: true,
        default_bindings_module: "agl_plugin::bindings::reward",
        export_macro_name: "export_reward_world",
    });
}
