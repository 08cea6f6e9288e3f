//! Hand-made calls for the unit tests.

use std::borrow::Cow;
use std::cell::Cell;

use crate::call::{Api, Call, Choice, PromptLink};

#[derive(Debug, Clone)]
pub struct TestCall {
    pub index: u32,
    pub api: Api,
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub weight_version: u64,
    pub tags: Vec<(String, String)>,
    pub continues: Option<u32>,
    pub choice: Option<Choice>,
    pub request: String,
    pub response: String,
    /// The prompt as linked (`extends`, `shared`), as a guest sees it.
    pub link: Option<(Option<u32>, usize)>,
    /// How often the whole prompt was asked for.
    pub fetched: Cell<usize>,
}

/// Call `index` with these prompt and response ids and `{}` bodies.
pub fn call(index: u32, prompt: &[u32], response: &[u32]) -> TestCall {
    TestCall {
        index,
        api: Api::ChatCompletions,
        prompt_ids: prompt.to_vec(),
        response_ids: response.to_vec(),
        logprobs: vec![-0.5; response.len()],
        weight_version: 0,
        tags: Vec::new(),
        continues: None,
        choice: None,
        request: "{}".into(),
        response: "{}".into(),
        link: None,
        fetched: Cell::new(0),
    }
}

impl Call for TestCall {
    fn index(&self) -> u32 {
        self.index
    }
    fn api(&self) -> Api {
        self.api
    }
    fn prompt_ids(&self) -> Cow<'_, [u32]> {
        self.fetched.set(self.fetched.get() + 1);
        Cow::Borrowed(&self.prompt_ids)
    }
    fn prompt_link(&self) -> Option<PromptLink<'_>> {
        let (extends, shared) = self.link?;
        Some(PromptLink {
            extends,
            shared,
            tail: &self.prompt_ids[shared..],
        })
    }
    fn response_ids(&self) -> &[u32] {
        &self.response_ids
    }
    fn response_logprobs(&self) -> &[f32] {
        &self.logprobs
    }
    fn weight_version(&self) -> u64 {
        self.weight_version
    }
    fn tag(&self, key: &str) -> Option<&str> {
        let found = self.tags.iter().find(|(k, _)| k.eq_ignore_ascii_case(key));
        found.map(|(_, v)| v.as_str())
    }
    fn continues(&self) -> Option<u32> {
        self.continues
    }
    fn choice(&self) -> Option<Choice> {
        self.choice
    }
    fn request_json(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.request))
    }
    fn response_json(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.response))
    }
}
