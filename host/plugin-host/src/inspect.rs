//! What `agl plugin inspect` shows: the world, the plugin's own description
//! and the component's imports and exports with their types.

use std::path::PathBuf;

use serde::Serialize;
use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime::component::types::{ComponentFunc, ComponentItem, Type};

use super::{LoadReport, PluginInfo, WitVersion, World};

#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub path: PathBuf,
    pub world: World,
    /// The `agl:adapter` version it was built against.
    pub wit: WitVersion,
    /// What the plugin's `describe` export returned.
    pub info: PluginInfo,
    pub imports: Vec<Item>,
    pub exports: Vec<Item>,
    #[serde(skip)]
    pub load: LoadReport,
}

/// One import or export: its name and a one-line rendering of its type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    pub name: String,
    pub ty: String,
}

pub(crate) fn imports(engine: &Engine, component: &Component) -> Vec<Item> {
    let ty = component.component_type();
    ty.imports(engine)
        .map(|(name, ext)| item(engine, name, &ext.ty))
        .collect()
}

pub(crate) fn exports(engine: &Engine, component: &Component) -> Vec<Item> {
    let ty = component.component_type();
    ty.exports(engine)
        .map(|(name, ext)| item(engine, name, &ext.ty))
        .collect()
}

fn item(engine: &Engine, name: &str, ty: &ComponentItem) -> Item {
    Item {
        name: name.to_string(),
        ty: render_item(engine, ty),
    }
}

fn render_item(engine: &Engine, item: &ComponentItem) -> String {
    match item {
        ComponentItem::ComponentFunc(func) => render_func(func),
        ComponentItem::ComponentInstance(instance) => {
            let names: Vec<&str> = instance.exports(engine).map(|(name, _)| name).collect();
            format!("instance {{ {} }}", names.join(", "))
        }
        ComponentItem::CoreFunc(_) => "core func".to_string(),
        ComponentItem::Module(_) => "core module".to_string(),
        ComponentItem::Component(_) => "component".to_string(),
        ComponentItem::Type(ty) => format!("type {}", render_type(ty)),
        ComponentItem::Resource(_) => "resource".to_string(),
    }
}

fn render_func(func: &ComponentFunc) -> String {
    let params: Vec<String> = func
        .params()
        .map(|(name, ty)| format!("{name}: {}", render_type(&ty)))
        .collect();
    let results: Vec<String> = func.results().map(|ty| render_type(&ty)).collect();
    match results.as_slice() {
        [] => format!("func({})", params.join(", ")),
        [one] => format!("func({}) -> {one}", params.join(", ")),
        many => format!("func({}) -> ({})", params.join(", "), many.join(", ")),
    }
}

/// WIT-like rendering. Records show field names only: nested records such
/// as `rollout` would otherwise fill a screen.
fn render_type(ty: &Type) -> String {
    match ty {
        Type::Bool => "bool".into(),
        Type::S8 => "s8".into(),
        Type::U8 => "u8".into(),
        Type::S16 => "s16".into(),
        Type::U16 => "u16".into(),
        Type::S32 => "s32".into(),
        Type::U32 => "u32".into(),
        Type::S64 => "s64".into(),
        Type::U64 => "u64".into(),
        Type::Float32 => "f32".into(),
        Type::Float64 => "f64".into(),
        Type::Char => "char".into(),
        Type::String => "string".into(),
        Type::List(list) => format!("list<{}>", render_type(&list.ty())),
        Type::Option(option) => format!("option<{}>", render_type(&option.ty())),
        Type::Result(result) => {
            let side = |t: Option<Type>| t.map_or("_".to_string(), |t| render_type(&t));
            format!("result<{}, {}>", side(result.ok()), side(result.err()))
        }
        Type::Tuple(tuple) => {
            let types: Vec<String> = tuple.types().map(|t| render_type(&t)).collect();
            format!("tuple<{}>", types.join(", "))
        }
        Type::Record(record) => {
            let fields: Vec<&str> = record.fields().map(|f| f.name).collect();
            format!("record {{ {} }}", fields.join(", "))
        }
        Type::Variant(variant) => {
            let cases: Vec<&str> = variant.cases().map(|c| c.name).collect();
            format!("variant {{ {} }}", cases.join(", "))
        }
        Type::Enum(e) => format!("enum {{ {} }}", e.names().collect::<Vec<_>>().join(", ")),
        Type::Flags(flags) => format!(
            "flags {{ {} }}",
            flags.names().collect::<Vec<_>>().join(", ")
        ),
        Type::Own(_) => "own<resource>".into(),
        Type::Borrow(_) => "borrow<resource>".into(),
        Type::Map(_) => "map".into(),
        Type::Future(_) => "future".into(),
        Type::Stream(_) => "stream".into(),
        Type::ErrorContext => "error-context".into(),
        Type::FixedLengthList(_) => "fixed-length-list".into(),
    }
}
