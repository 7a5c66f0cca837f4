//! A crate's Rust sources: every struct and enum deriving `DomainEvent` or
//! `EventPayload`, and the names of the other types it defines. `cargo
//! outbox` records and checks events from them; the derive reads the
//! payload types nested in an event from them, so that a change in one is
//! reported like a change in the event.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;
use syn::visit_mut::VisitMut;
use syn::{Attribute, DeriveInput};

use crate::ctxt::Ctxt;
use crate::model::{Event, Payload};
use crate::schema_lock::TypeEntry;
use crate::ty;

/// A struct or enum found in a source file.
pub struct Item {
    /// The file, relative to the crate root when it is inside it.
    pub file: PathBuf,
    /// The item, as a derive sees it.
    pub input: DeriveInput,
}

impl Item {
    /// `file:line` of `span`, for messages.
    pub fn location(&self, span: proc_macro2::Span) -> String {
        format!("{}:{}", self.file.display(), span.start().line)
    }
}

/// What the sources define.
#[derive(Default)]
pub struct Sources {
    /// Structs deriving `DomainEvent`.
    pub events: Vec<Item>,
    /// Types deriving `EventPayload`, by name.
    pub payloads: BTreeMap<String, Vec<Item>>,
    /// Every other struct or enum, by name: where it is.
    pub other_types: BTreeMap<String, String>,
    /// `type Name = ..;` aliases without parameters, by name.
    pub aliases: BTreeMap<String, syn::Type>,
    /// Alias names defined more than once, as different types (in
    /// different modules): which one a field means is not known here, so
    /// they are not resolved.
    pub ambiguous_aliases: BTreeSet<String>,
}

/// Reads every `.rs` file under `dirs` (relative to `crate_dir`; missing
/// ones are skipped).
pub fn scan(crate_dir: &Path, dirs: &[PathBuf]) -> Result<Sources, String> {
    read(crate_dir, &files(crate_dir, dirs)?)
}

/// Every `.rs` file under `dirs` (relative to `crate_dir`; missing ones are
/// skipped), in order.
pub fn files(crate_dir: &Path, dirs: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for dir in dirs {
        collect_rs_files(&crate_dir.join(dir), &mut files)?;
    }
    files.sort();
    Ok(files)
}

/// Reads the source files `files`, named relative to `crate_dir` when they
/// are inside it.
pub fn read(crate_dir: &Path, files: &[PathBuf]) -> Result<Sources, String> {
    let mut sources = Sources::default();
    for path in files {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        let file = path.strip_prefix(crate_dir).unwrap_or(path);
        sources.add_file(file, &text)?;
    }
    sources.resolve_aliases();
    Ok(sources)
}

impl Sources {
    /// Adds the items of the source file `file` (as messages name it).
    pub fn add_file(&mut self, file: &Path, text: &str) -> Result<(), String> {
        let syntax = syn::parse_file(text).map_err(|error| {
            let start = error.span().start();
            format!(
                "cannot parse {}:{}:{}: {error}; fix the syntax error first",
                file.display(),
                start.line,
                start.column + 1
            )
        })?;
        let mut visitor = Collector {
            file,
            sources: self,
        };
        visitor.visit_file(&syntax);
        Ok(())
    }
}

impl Sources {
    /// Spells every alias in the fields of events and payload types as the
    /// type it names, as the lock records it: `quantity: Quantity` for
    /// `type Quantity = u32;` is recorded as `u32` (the derive, which sees
    /// `Quantity`, reaches `u32`'s shape through `EventPayload`).
    pub fn resolve_aliases(&mut self) {
        if self.aliases.is_empty() {
            return;
        }
        let mut resolver = Resolver {
            aliases: &self.aliases,
            ambiguous: &self.ambiguous_aliases,
            depth: 0,
        };
        let items = self
            .events
            .iter_mut()
            .chain(self.payloads.values_mut().flatten());
        for item in items {
            resolver.visit_derive_input_mut(&mut item.input);
        }
    }
}

/// Replaces aliases in types with what they name.
struct Resolver<'a> {
    aliases: &'a BTreeMap<String, syn::Type>,
    ambiguous: &'a BTreeSet<String>,
    /// Aliases being replaced inside one another; a cycle stops at 16.
    depth: usize,
}

impl VisitMut for Resolver<'_> {
    fn visit_type_mut(&mut self, ty: &mut syn::Type) {
        if let syn::Type::Path(path) = ty
            && path.qself.is_none()
            && let Some(last) = path.path.segments.last()
            && last.arguments.is_empty()
            && let Some(named) = self.aliases.get(&crate::attr::unraw(&last.ident))
            && !self.ambiguous.contains(&crate::attr::unraw(&last.ident))
            && self.depth < 16
        {
            *ty = named.clone();
            self.depth += 1;
            self.visit_type_mut(ty);
            self.depth -= 1;
            return;
        }
        syn::visit_mut::visit_type_mut(self, ty);
    }
}

fn collect_rs_files(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), String> {
    let cannot_read = |error: std::io::Error| format!("cannot read {}: {error}", dir.display());
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(cannot_read(error)),
    };
    for entry in entries {
        let path = entry.map_err(cannot_read)?.path();
        if path.is_dir() {
            collect_rs_files(&path, files)?;
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    Ok(())
}

struct Collector<'a> {
    file: &'a Path,
    sources: &'a mut Sources,
}

impl Collector<'_> {
    fn add(&mut self, input: DeriveInput) {
        let name = crate::attr::unraw(&input.ident);
        let item = Item {
            file: self.file.to_owned(),
            input,
        };
        if derives(&item.input.attrs, "DomainEvent") {
            self.sources.events.push(item);
        } else if derives(&item.input.attrs, "EventPayload") {
            self.sources.payloads.entry(name).or_default().push(item);
        } else {
            let location = item.location(item.input.ident.span());
            self.sources.other_types.entry(name).or_insert(location);
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_struct(&mut self, item: &'ast syn::ItemStruct) {
        self.add(item.clone().into());
        syn::visit::visit_item_struct(self, item);
    }

    fn visit_item_enum(&mut self, item: &'ast syn::ItemEnum) {
        self.add(item.clone().into());
        syn::visit::visit_item_enum(self, item);
    }

    fn visit_item_type(&mut self, item: &'ast syn::ItemType) {
        if item.generics.params.is_empty() {
            let name = crate::attr::unraw(&item.ident);
            let spelled = |ty: &syn::Type| quote::ToTokens::to_token_stream(ty).to_string();
            match self.sources.aliases.get(&name) {
                Some(known) if spelled(known) != spelled(&item.ty) => {
                    self.sources.ambiguous_aliases.insert(name);
                }
                Some(_) => {}
                None => {
                    self.sources.aliases.insert(name, (*item.ty).clone());
                }
            }
        }
        syn::visit::visit_item_type(self, item);
    }
}

/// Whether `attrs` hold `#[derive(.., name, ..)]` (under any path).
fn derives(attrs: &[Attribute], name: &str) -> bool {
    attrs
        .iter()
        .filter(|attr| attr.path().is_ident("derive"))
        .any(|attr| {
            let mut found = false;
            let _ = attr.parse_nested_meta(|meta| {
                found |= meta
                    .path
                    .segments
                    .last()
                    .is_some_and(|last| last.ident == name);
                Ok(())
            });
            found
        })
}

/// The payload types reachable from an event's fields, as the sources
/// define them.
#[derive(Default)]
pub struct NestedTypes {
    /// Each payload type found, by name, as the lock records it.
    pub types: BTreeMap<String, TypeEntry>,
    /// Problems that stop the types from being recorded: a name defined
    /// twice, a nested type without `EventPayload`, an invalid payload
    /// type. One line each.
    pub errors: Vec<String>,
    /// Types the sources do not define (another crate's), one line each:
    /// they are compared by name only.
    pub outside: Vec<String>,
}

impl NestedTypes {
    /// Whether every reachable type was found and read.
    pub fn complete(&self) -> bool {
        self.errors.is_empty() && self.outside.is_empty()
    }
}

impl Sources {
    /// The payload types reachable from the fields of `event`, declared at
    /// `location` (`file:line`, for messages).
    pub fn nested_types(&self, event: &Event<'_>, location: &str) -> NestedTypes {
        let mut nested = NestedTypes::default();
        let params = event.type_params();
        let mut pending: Vec<(String, String)> = Vec::new();
        for field in &event.fields {
            for inner in field.payload_types(&params) {
                let used_by = format!(
                    "field `{}` of {} ({location})",
                    field.name,
                    event.entry().title(),
                );
                pending.push((ty::payload_name(inner), used_by));
            }
        }
        while let Some((name, used_by)) = pending.pop() {
            if nested.types.contains_key(&name) {
                continue;
            }
            let Some(payload_item) = self.payload_item(&name, &used_by, &mut nested) else {
                continue;
            };
            let cx = Ctxt::default();
            let payload = Payload::from_ast(&cx, &payload_item.input);
            if let Err(errors) = cx.check() {
                for error in errors {
                    let here = payload_item.location(error.span());
                    nested.errors.push(format!("{here}: {error}"));
                }
                continue;
            }
            let Some(payload) = payload else { continue };
            for field in payload.all_fields() {
                for inner in field.payload_types(&[]) {
                    let inner_name = ty::payload_name(inner);
                    if inner_name != name {
                        pending.push((inner_name, format!("`{name}`")));
                    }
                }
            }
            nested.types.insert(name, payload.entry());
        }
        nested
    }

    /// The one item deriving `EventPayload` named `name`, or why there is
    /// none (added to `nested`).
    fn payload_item(&self, name: &str, used_by: &str, nested: &mut NestedTypes) -> Option<&Item> {
        if self.ambiguous_aliases.contains(name) {
            nested.errors.push(format!(
                "`{name}`, used by {used_by}, is a type alias defined more than once, as \
                 different types: give the aliases distinct names, or write the type at the \
                 field"
            ));
            return None;
        }
        match self.payloads.get(name).map(Vec::as_slice) {
            Some([only]) => return Some(only),
            Some(several) => {
                let places: Vec<String> = several
                    .iter()
                    .map(|item| item.location(item.input.ident.span()))
                    .collect();
                nested.errors.push(format!(
                    "`{name}` is defined more than once ({}); payload types are recorded by \
                     name, so give them distinct names",
                    places.join(", ")
                ));
            }
            None => match self.other_types.get(name) {
                Some(location) => nested.errors.push(format!(
                    "{location}: `{name}` is nested in event payloads but does not derive \
                     EventPayload; add #[derive(EventPayload)] so its shape is recorded and \
                     checked"
                )),
                None => nested.outside.push(format!(
                    "`{name}`, used by {used_by}, is not defined in this crate: its shape is \
                     not recorded, so it is compared by name only"
                )),
            },
        }
        None
    }
}
