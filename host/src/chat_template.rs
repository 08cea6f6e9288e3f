//! Hugging Face chat templates rendered with minijinja.
pub struct ChatTemplate;
