#!/usr/bin/env bash

python3 /app/tool.py 3 4; ls -l /app/tool.py

sed -i 's/^print total$/print(total)/' /app/tool.py && sed -i '1i #!/usr/bin/env python3' /app/tool.py && chmod +x /app/tool.py && /app/tool.py 3 4
