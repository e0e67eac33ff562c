//! What the gateway answers itself: a page for a browser, the same words as plain text for
//! anything else (curl, the CLI).

use axum::{
    body::Body,
    response::{IntoResponse, Response},
};
use http::{HeaderMap, HeaderValue, StatusCode, header};

/// One of the gateway's own answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub status: StatusCode,
    pub title: String,
    /// Paragraphs, each said in full.
    pub lines: Vec<String>,
    /// Seconds after which a browser loads the page again (a starting workspace).
    pub refresh: Option<u32>,
    /// A button for a browser (the start button); boxed, as pages travel in `Err`s.
    pub form: Option<Box<Form>>,
}

/// A form of one button that posts hidden fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Form {
    pub action: String,
    pub fields: Vec<(String, String)>,
    pub button: String,
}

impl Page {
    pub fn new(status: StatusCode, title: impl Into<String>) -> Self {
        Page {
            status,
            title: title.into(),
            lines: vec![],
            refresh: None,
            form: None,
        }
    }

    pub fn form(mut self, form: Option<Form>) -> Self {
        self.form = form.map(Box::new);
        self
    }

    pub fn line(mut self, line: impl Into<String>) -> Self {
        self.lines.push(line.into());
        self
    }

    pub fn refresh(mut self, seconds: u32) -> Self {
        self.refresh = Some(seconds);
        self
    }

    /// The page as HTML when the caller accepts it, else as text.
    pub fn answer(self, request: &HeaderMap) -> Response {
        let html = request
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/html"));
        let mut response = if html {
            let refresh = self
                .refresh
                .map(|s| format!("<meta http-equiv=\"refresh\" content=\"{s}\">"))
                .unwrap_or_default();
            let mut body: String = self
                .lines
                .iter()
                .map(|l| format!("<p>{}</p>\n", escape(l)))
                .collect();
            if let Some(form) = &self.form {
                body.push_str(&format!(
                    "<form method=\"post\" action=\"{}\">",
                    escape(&form.action)
                ));
                for (name, value) in &form.fields {
                    body.push_str(&format!(
                        "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
                        escape(name),
                        escape(value)
                    ));
                }
                body.push_str(&format!(
                    "<button type=\"submit\">{}</button></form>\n",
                    escape(&form.button)
                ));
            }
            let text = format!(
                "<!doctype html>\n<html><head><meta charset=\"utf-8\">{refresh}<title>{title}</title></head>\n<body><h1>{title}</h1>\n{body}</body></html>\n",
                title = escape(&self.title)
            );
            let mut r = (self.status, text).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            r
        } else {
            let mut text = self.title.clone();
            for line in &self.lines {
                text.push('\n');
                text.push_str(line);
            }
            text.push('\n');
            (self.status, Body::from(text)).into_response()
        };
        let headers = response.headers_mut();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert("x-berth-gateway", HeaderValue::from_static("1"));
        // Never inside another site's frame (its start button could be clicked for you).
        headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("frame-ancestors 'none'"),
        );
        if let Some(seconds) = self.refresh
            && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
        {
            if self.status == StatusCode::TOO_MANY_REQUESTS {
                headers.insert(header::RETRY_AFTER, value.clone());
            }
            headers.insert("refresh", value);
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"berth\""),
            );
        }
        response
    }
}

/// Text as HTML shows it, whatever it holds (a workspace's message is its author's).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspaces_words_cannot_become_markup() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
    }
}
